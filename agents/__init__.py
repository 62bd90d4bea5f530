"""Agents: one folder per algorithm, each exposing a Builder."""
