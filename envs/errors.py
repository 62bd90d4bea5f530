"""Errors of the env factories, apart so that every factory module can raise them."""


class UnknownEnvError(ValueError):
    """The env id is not registered (or its package is not installed)."""
