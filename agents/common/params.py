"""`Params`, the type name of a network's parameters, and `pure_apply`.

A network's parameters are a pytree of arrays whose structure the network defines (Flax's
nested dicts of kernels and biases; an actor-critic's {"policy": ..., "critic": ...}). No
static type says more about a pytree of arbitrary structure, so `Params` is `Any`; the name
says what the value is where a bare `Any` would not.
"""

from collections.abc import Callable
from typing import Any

import flax.linen as nn

Params = Any


def pure_apply(module: nn.Module) -> Callable[..., Any]:
    """`module.apply`, for a networks' field that types its arguments and output.

    Flax annotates `apply`'s result as the module's output or, with `mutable=`, a pair of it
    and the changed variables. No agent passes `mutable=`, so the result is the module's
    output, which the field that holds the function names.
    """
    return module.apply
