"""The XLA_FLAGS entries a run adds (builders/experiments/xla_flags.py): added only where the
user's XLA_FLAGS lacks them, in the environment the run trains in (its node processes inherit
it); that XLA accepts them: tests/test_anakin_devices.py."""

import os

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
