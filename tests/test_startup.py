"""Start-up: JAX's persistent compilation cache beside the run directory (a second run of the
same config compiles nothing, `--no_compile_cache` keeps none) and the start-up times in
summary.json."""

import json
import os
import subprocess
import sys

import jax
import pytest

from trellis.builders.experiments.session import COMPILE_CACHE_SUBDIR, compile_cache

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(run_dir, *flags):
    # One learner batch size: with `--learner_batch=auto` the learner compiles a larger size
    # only once unrolls back up (`learner_update.CompileAhead`), a matter of timing, so on a
    # loaded machine the second run could need a size the first never compiled.
    out = subprocess.run(
        [sys.executable, os.path.join(REPO, "launch", "run.py"), "--platform=local_mp",
         "--total_env_steps=2000", "--stop_at_return=none", "--num_actors=2",
         "--envs_per_actor=32", "--learner_batch=fixed", "--quiet", f"--logdir={run_dir}",
         *flags],
        capture_output=True, text=True, timeout=600, cwd=REPO)  # A hang guard.
    assert out.returncode == 0, out.stderr[-3000:]
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


def _cache_entries(runs):
    cache = runs / COMPILE_CACHE_SUBDIR
    return sorted(os.listdir(cache)) if cache.exists() else []


def test_second_run_of_a_config_compiles_nothing_and_reports_startup(tmp_path):
    first = _run(tmp_path / "first")
    compiled = _cache_entries(tmp_path)
    assert compiled, "the first run wrote no compiled program"
    startup = first["startup_s"]
    assert 0 < startup["first_env_step"] <= startup["first_learner_step"], startup
    _run(tmp_path / "second")
    # JAX writes an entry for every program it compiles (none are too fast to keep): no new
    # entry means the second run loaded every program it needed.
    new = sorted(set(_cache_entries(tmp_path)) - set(compiled))
    assert new == [], f"the second run compiled {len(new)} program(s) again: {new}"


@pytest.mark.slow
def test_no_compile_cache_keeps_none(tmp_path):
    summary = _run(tmp_path / "run", "--no_compile_cache")
    assert summary["learner_steps"] > 0 and _cache_entries(tmp_path) == []


def test_compile_cache_settings_are_restored_on_exit(tmp_path):
    name = "JAX_COMPILATION_CACHE_DIR"
    before_env, before_dir = os.environ.get(name), jax.config.jax_compilation_cache_dir
    with compile_cache(str(tmp_path)):
        assert os.environ[name] == str(tmp_path) == jax.config.jax_compilation_cache_dir
        assert os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] == "0.0"
    assert (os.environ.get(name), jax.config.jax_compilation_cache_dir) == (before_env,
                                                                            before_dir)
    with compile_cache(None):
        assert os.environ.get(name) == before_env
