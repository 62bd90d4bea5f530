"""The XLA_FLAGS entries a run adds (builders/experiments/xla_flags.py): added only where the
user's XLA_FLAGS lacks them. run.py's use of them, and that XLA accepts them:
tests/test_anakin_devices.py."""

import os

import pytest

from trellis.builders.experiments.xla_flags import FAST_GPU_AUTOTUNE, xla_flags_unless_set


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
