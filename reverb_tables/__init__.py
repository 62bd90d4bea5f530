"""Replay tables with Reverb semantics (native backend by default, dm-reverb optional)."""
