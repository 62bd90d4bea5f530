"""A greedy policy as ONNX, through jax2onnx (the `onnx` extra): DIR/policy.onnx beside
policy.jax (`LoadedPolicy.export(DIR, onnx=True)`, `evaluate.py RUN_DIR --export=DIR --onnx`).

The model takes a batch of observations, input "obs" [N, *observation_shape] of the spec's
dtype (N free), and gives the greedy actions [N, ...], params inside; onnxruntime runs it:

    session = onnxruntime.InferenceSession("DIR/policy.onnx")
    actions = session.run(None, {"obs": observations})[0]

What converts is a feed-forward policy of a single-agent env (docs/export.md lists the agents,
as tests/test_onnx_export.py converts each); a recurrent policy (R2D2), a multi-agent one and a
search (AlphaZero) are refused in one line. jax2onnx pins orbax-checkpoint below the version
.venv holds, so the extra lives in its own environment (`make test-onnx`).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

import jax

from trellis.envs.specs import EnvSpec

ONNX_FILE = "policy.onnx"
INPUT, OUTPUT = "obs", "actions"


class OnnxError(ValueError):
    """A policy that cannot be written as ONNX: one line."""


def write_onnx(greedy: Callable[[Any], Any], spec: EnvSpec, path: str) -> str:
    """Converts `greedy` (a batch of observations -> the greedy actions, params inside) to ONNX
    at `path`, its batch axis symbolic; returns `path`.

    Raises:
      OnnxError: jax2onnx is not installed (naming the extra), or cannot convert the function
        (naming what it met).
    """
    try:
        jax2onnx = importlib.import_module("jax2onnx")
    except ImportError as e:
        raise OnnxError(f"ONNX export needs jax2onnx: pip install -e '.[onnx]' ({e})") from e
    try:
        (n,) = jax.export.symbolic_shape("N")
        jax2onnx.to_onnx(greedy, [jax.ShapeDtypeStruct((n, *spec.observation_shape),
                                                       spec.observation_dtype)],
                         model_name="trellis_policy", return_mode="file", output_path=path,
                         input_names=[INPUT], output_names=[OUTPUT])
    except TypeError:
        raise  # A wrong call of jax2onnx's API: a bug here, not the user's input.
    except Exception as e:  # jax2onnx raises plain errors for primitives it lacks.
        if os.path.exists(path):
            os.remove(path)  # Nothing half-written stays.
        raise OnnxError(f"jax2onnx cannot convert this policy: {type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}") from e
    return path
