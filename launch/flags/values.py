"""A setting's value from its command-line text, and back, in the command line's own
spelling (none, auto, booleans as true/false, sequences comma-separated); `UsageError` is what
bad input raises everywhere in `trellis.launch.flags`."""

from __future__ import annotations

from typing import Any

from trellis.builders.contract.config import Setting

# stop_at_return's command-line value for the env's Gymnasium reward_threshold; resolved by
# `parsing` (the library's ExperimentConfig knows no env, so its default is None: no target).
AUTO = "auto"
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


class UsageError(Exception):
    """Bad command-line or settings-file input: one line for the user, exit code 2."""


def from_text(s: Setting, text: str) -> Any:
    """A setting's value from its command-line text.

    Raises:
      UsageError: the text is not a value of the setting's type.
    """
    if s.optional and text.lower() == "none":
        return None
    if s.name == "stop_at_return" and text == AUTO:  # Resolved once the env is known.
        return AUTO
    if s.sequence:
        return tuple(_scalar(s, item.strip()) for item in text.split(",") if item.strip())
    return _scalar(s, text)


def _scalar(s: Setting, text: str) -> Any:
    try:
        if s.kind is bool:
            if text.lower() not in _TRUE + _FALSE:
                raise ValueError(text)
            return text.lower() in _TRUE
        return s.kind(text)
    except ValueError:
        raise UsageError(f"--{s.name} must be {requirement(s)}, got {text!r}") from None


def requirement(s: Setting) -> str:
    """What the command line allows for `s`, in its own spelling (none, auto)."""
    text = s.requirement().replace(" or None", " or none")
    return text.replace(" or none", ", none or auto") if s.name == "stop_at_return" else text


def quoted(value: Any) -> str:
    """A value for an error message: numbers as they are, anything else quoted."""
    plain = isinstance(value, (int, float)) and not isinstance(value, bool)
    return shown(value) if plain else repr(shown(value))


def shown(value: Any) -> str:
    """A value as it is written on the command line."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(shown(v) for v in value)
    return str(value)
