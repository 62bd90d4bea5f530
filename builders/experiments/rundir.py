"""The run directory: what a run leaves behind for people and tools.

    runs/<agent>-<env>-<time>/
      config.json          every resolved setting (see COMMAND_LINE), versions, git commits
      metrics.jsonl        one JSON record per log interval (see `metrics_record`)
      events.out.tfevents.* TensorBoard scalars (tensorboardX: no TensorFlow needed)
      summary.json         how and when the run stopped
      learning_curve.png   return vs env steps and vs wall time (launch/plot.py)
      videos/              episodes of the greedy policy as MP4 (run.py --video; recording.py)
      checkpoints/         learner checkpoints (builders/experiments/checkpointing.py)
      .lock                held by the run.py writing here (`claim`)

Nothing here imports JAX: the launcher process only writes files.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import importlib.abc
import importlib.metadata
import json
import math
import os
import platform
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

METRICS = "metrics.jsonl"
CONFIG = "config.json"
SUMMARY = "summary.json"
CURVE = "learning_curve.png"
VIDEOS = "videos"
LOCK = ".lock"
# config.json's sections: the settings (the command line's options, ExperimentConfig, the
# agent's config; launch/flags.py reads them back), then the run's record (created, versions,
# git commit, one entry per session), which is not a setting.
COMMAND_LINE, EXPERIMENT, AGENT_CONFIG, RUN_RECORD = (
    "command_line", "experiment", "agent_config", "run")
_VERSIONED = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "gymnasium", "numpy",
              "tensorboardX")
# Keys of the learner node's stats that are not learner metrics.
_STATS_KEYS = {
    "env_steps", "learner_steps", "episodes", "mean_return", "min_return", "max_return",
    "returns_in_window", "mean_episode_length", "evaluation", "elapsed_s", "resumes",
    "env_steps_per_s", "inference_batches", "slot_resets", "queue_size", "policy_lag_mean",
    "policy_lag_max", "inference_batch_mean", "learning_rate",
}


def write_json(path: str, data: dict[str, Any]) -> None:
    """Writes `data` to `path` atomically (never a half-written file)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, default=str)
        f.write("\n")
    os.replace(tmp, path)


def read_json(path: str) -> dict[str, Any]:
    with open(path) as f:
        data: dict[str, Any] = json.load(f)  # The run's files, each one JSON object.
    return data


def versions() -> dict[str, str | None]:
    """Python's and the main libraries' versions (from package metadata: nothing imported)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in _VERSIONED:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit(path: str | None = None) -> str | None:
    """The commit checked out where the code lives (with "-dirty" for local changes), or None."""
    cwd = path or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=cwd, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("-dirty" if dirty else "")


def read_metrics(run_dir: str) -> list[dict[str, Any]]:
    """The records of a run's metrics.jsonl (a torn last line, from a killed run, is skipped)."""
    path = os.path.join(run_dir, METRICS)
    records: list[dict[str, Any]] = []
    if not os.path.exists(path):
        return records
    with open(path) as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def metrics_record(stats: dict[str, Any], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """One metrics.jsonl record from the learner node's `stats()`.

    Fields: time, wall_time_s (training time over all sessions), env_steps, learner_steps,
    episodes, env_steps_per_s (over about the last 5 s), return_mean/min/max and
    episode_length_mean over the return window, queue_size, policy_lag_mean and policy_lag_max
    (learner updates between the params that acted and the update that learned from it, over the
    log interval; agents fed unrolls in order), inference_batch_mean (env steps per policy call
    of the central inference over the log interval), restarts (env-worker restarts seen by
    inference), resumes, learning_rate (in effect, where the stats give it), the learner's
    metrics as `learner/<name>`, and `extra`.
    """
    record: dict[str, Any] = {
        "time": round(time.time(), 3),
        "wall_time_s": round(float(stats.get("elapsed_s", 0.0)), 3),
        "env_steps": int(stats.get("env_steps", 0)),
        "learner_steps": int(stats.get("learner_steps", 0)),
        "episodes": int(stats.get("episodes", 0)),
        "env_steps_per_s": round(float(stats.get("env_steps_per_s", 0.0)), 1),
        "return_mean": stats.get("mean_return"),
        "return_min": stats.get("min_return"),
        "return_max": stats.get("max_return"),
        "episode_length_mean": stats.get("mean_episode_length"),
        "queue_size": stats.get("queue_size"),
        "policy_lag_mean": stats.get("policy_lag_mean"),
        "policy_lag_max": stats.get("policy_lag_max"),
        "inference_batch_mean": stats.get("inference_batch_mean"),
        "restarts": stats.get("slot_resets", 0),
        "resumes": stats.get("resumes", 0),
    }
    if "learning_rate" in stats:  # In effect (the schedule's factor applied): the run's.
        record["learning_rate"] = stats["learning_rate"]
    for name, value in sorted(stats.items()):
        if name not in _STATS_KEYS and _number(value) is not None:
            record[f"learner/{name}"] = value
    record.update(extra or {})
    return record


class _NoTorchForThisThread(importlib.abc.MetaPathFinder):
    """Refuses `import torch` to the thread that made it; other threads import it as usual."""

    def __init__(self) -> None:
        self._thread = threading.get_ident()

    def find_spec(self, fullname: str, path: object, target: object = None) -> None:
        if fullname == "torch" and threading.get_ident() == self._thread:
            raise ModuleNotFoundError("not imported for TensorBoard", name=fullname)
        return None  # Not ours to find: the next finders look.


def _summary_writer() -> Any:
    """tensorboardX's SummaryWriter, imported without PyTorch unless torch is imported already.
    (Any: tensorboardX is unannotated.)

    tensorboardX imports torch wherever it is installed, only to accept torch tensors, which
    this writer never gets: on the H100 machine that made importing it take 3.2 s instead of
    0.4 s, and the launcher hold 650 MB instead of 230 MB (docs/benchmarks.md).
    """
    finder = _NoTorchForThisThread()
    sys.meta_path.insert(0, finder)
    try:
        from tensorboardX import SummaryWriter
    finally:
        sys.meta_path.remove(finder)
    return SummaryWriter


class Tracker(Protocol):
    """A tracked run elsewhere (Weights & Biases, MLflow: builders/experiments/tracking.py):
    the config, the metrics as they are written, the files at the end."""

    @property
    def run_id(self) -> str:
        """The backend's id of the tracked run (a resumed run continues it)."""

    def start(self, config: Mapping[str, Any]) -> None:
        """Sends the run's resolved config (config.json's content)."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Sends one metrics record's numeric fields (`numeric_fields`) at `step` env steps."""

    def finish(self, curve: str | None, videos: Sequence[str], failed: bool) -> None:
        """Sends the learning curve (a PNG) and the videos (MP4) and ends the tracked run."""


def numeric_fields(record: Mapping[str, Any]) -> dict[str, float]:
    """A metrics record's finite numbers, less the step axis (env_steps) and the clock (time)."""
    return {name: number for name, value in record.items()
            if name not in ("env_steps", "time") and (number := _number(value)) is not None}


class RunWriter:
    """Appends metrics to metrics.jsonl, TensorBoard and the tracker; writes config and summary.

    A resumed run passes `resume_env_steps`: records past that point came from the part of the
    killed run that the checkpoint does not hold, so they are dropped (from metrics.jsonl
    here, from TensorBoard through its purge step) and the curves continue from the
    checkpoint without a fold.

    Args:
      run_dir: the run directory (created if missing).
      resume_env_steps: the env steps of the checkpoint a resumed run continues from.
      tracker: where each record's numbers go too (`--track`), or None.
    """

    def __init__(self, run_dir: str, resume_env_steps: int | None = None,
                 tracker: Tracker | None = None):
        SummaryWriter = _summary_writer()

        self.run_dir = run_dir
        self._tracker = tracker
        os.makedirs(run_dir, exist_ok=True)
        self._metrics_path = os.path.join(run_dir, METRICS)
        self._last_env_steps = -1
        self._last_eval: Any = None
        if resume_env_steps is not None:
            kept = [r for r in read_metrics(run_dir) if r.get("env_steps", 0) <= resume_env_steps]
            tmp = self._metrics_path + ".tmp"
            with open(tmp, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in kept)
            os.replace(tmp, self._metrics_path)
            if kept:
                self._last_env_steps = kept[-1]["env_steps"]
                self._last_eval = kept[-1].get("eval_env_steps")
        self._metrics = open(self._metrics_path, "a")  # noqa: SIM115 -- closed in close().
        purge = None if resume_env_steps is None else resume_env_steps + 1
        self._tb = SummaryWriter(run_dir, purge_step=purge, flush_secs=10)

    @property
    def env_steps(self) -> int:
        """The env steps of the newest record (-1 before any)."""
        return self._last_env_steps

    def log(self, stats: dict[str, Any], extra: dict[str, Any] | None = None) -> bool:
        """Writes a record for `stats` if the env steps advanced; returns whether it did.

        A new evaluation result in `stats["evaluation"]` goes into the record as eval_*.
        """
        record = metrics_record(stats, extra)
        steps = record["env_steps"]
        if steps <= self._last_env_steps:
            return False
        evaluation = stats.get("evaluation")
        if evaluation and evaluation.get("env_steps") != self._last_eval:
            self._last_eval = evaluation["env_steps"]
            record.update({
                "eval_env_steps": evaluation["env_steps"],
                "eval_return_mean": evaluation["return_mean"],
                "eval_return_min": evaluation["return_min"],
                "eval_return_max": evaluation["return_max"],
                "eval_episodes": evaluation["episodes"],
            })
        self._last_env_steps = steps
        self._metrics.write(json.dumps(record) + "\n")
        self._metrics.flush()  # A killed run keeps every record written so far.
        for name, value in record.items():
            value = _number(value)
            if value is None or name in ("time", "env_steps") or name.startswith("eval_"):
                continue
            tag = name if "/" in name else f"train/{name}"
            self._tb.add_scalar(tag, value, steps)
        if "eval_env_steps" in record:
            for name in ("return_mean", "return_min", "return_max"):
                self._tb.add_scalar(f"eval/{name}", record[f"eval_{name}"],
                                    record["eval_env_steps"])
        if self._tracker is not None:
            self._tracker.log(numeric_fields(record), steps)
        return True

    def close(self) -> None:
        self._metrics.close()
        self._tb.close()


def new_run_dir(agent: str, env: str, root: str = "runs") -> str:
    """Creates `runs/<agent>-<env>-<time>` and returns its path; `-2`, `-3`, ... are appended
    when runs started in the same second (one per seed, say) would share the name. The env's
    characters other than letters, digits, `.`, `_` and `-` become `_` (`mycart:MyCart-v0`,
    `ALE/Pong-v5`): a colon in a path is a separator to TensorBoard's --logdir_spec, scp and
    Windows."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = os.path.join(root, f"{agent}-{re.sub(r'[^A-Za-z0-9._-]', '_', env)}-{stamp}")
    os.makedirs(root, exist_ok=True)
    path, n = base, 1
    while True:
        try:
            os.mkdir(path)  # Atomic: of two processes asking for one name, one gets it.
            return path
        except FileExistsError:
            n += 1
            path = f"{base}-{n}"


class RunDirInUse(RuntimeError):
    """Another process writes the run directory."""


@contextlib.contextmanager
def claim(run_dir: str) -> Iterator[None]:
    """Holds `run_dir` for this process while inside: a second claim, e.g. `--resume` of a
    run still going, fails at once instead of mixing its checkpoints and metrics with the
    first's. An advisory lock on RUN_DIR/.lock, which the kernel drops when its holder dies
    (a run killed with kill -9 resumes as before).

    Raises:
      RunDirInUse: another process holds it (the message names its pid).
    """
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, LOCK), "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            raise RunDirInUse(f"{run_dir} is in use by another run (pid {holder}): wait until "
                              "it stops") from None
        f.truncate(0)
        f.write(str(os.getpid()))
        f.flush()
        yield
