"""The XLA_FLAGS entries a run adds (builders/experiments/xla_flags.py): added only where the
user's XLA_FLAGS lacks them, seen by the run (and the node processes it starts), accepted by
the XLA that JAX ships."""

import os
import subprocess
import sys

import pytest

from trellis.builders.experiments.xla_flags import FAST_GPU_AUTOTUNE, xla_flags_unless_set
from trellis.launch import run


@pytest.mark.parametrize("own, inside", [
    (None, "--xla_gpu_autotune_level=1"),
    ("--xla_dump_to=/tmp/x", "--xla_dump_to=/tmp/x --xla_gpu_autotune_level=1"),
    ("--xla_gpu_autotune_level=4", "--xla_gpu_autotune_level=4"),
])
def test_the_fast_autotune_level_is_added_unless_the_user_names_one(own, inside, monkeypatch):
    if own is None:
        monkeypatch.delenv("XLA_FLAGS", raising=False)
    else:
        monkeypatch.setenv("XLA_FLAGS", own)
    with xla_flags_unless_set(FAST_GPU_AUTOTUNE):
        assert os.environ["XLA_FLAGS"] == inside
    assert os.environ.get("XLA_FLAGS") == own


@pytest.mark.parametrize("platform, expected", [
    ("local_mp", ["--xla_gpu_autotune_level"]),
    ("anakin", ["--xla_force_host_platform_device_count", "--xla_cpu_multi_thread_eigen",
                "--xla_gpu_autotune_level"]),
])
def test_run_trains_with_the_flags_of_its_platform(platform, expected, monkeypatch):
    seen = []
    monkeypatch.setattr(run, "train", lambda settings, argv: seen.append(
        os.environ["XLA_FLAGS"].split()) or 0)
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    env = "gymnax:CartPole-v1" if platform == "anakin" else "CartPole-v1"
    assert run.main([f"--platform={platform}", f"--env={env}"]) == 0
    assert [flag.split("=")[0] for flag in seen[0]] == expected
    assert "--xla_gpu_autotune_level=1" in seen[0]
    assert "XLA_FLAGS" not in os.environ


def test_jax_computes_with_the_added_flags():
    """XLA aborts the process on a flag it does not know: a renamed flag would stop every run."""
    script = ("from trellis.builders.experiments.xla_flags import FAST_GPU_AUTOTUNE, "
              "xla_flags_unless_set\nwith xla_flags_unless_set(FAST_GPU_AUTOTUNE):\n"
              "    import jax\n    print(int(jax.jit(lambda x: x * 3)(7)))")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["21"]
