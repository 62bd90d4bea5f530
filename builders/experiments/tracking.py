"""Tracking: a run sent to Weights & Biases or MLflow as it goes (`--track=wandb|mlflow`).

What goes out, from the run directory's own records (builders/experiments/rundir.py):

- at the start, the run's resolved config: config.json as the session wrote it (`start`);
- at each metrics.jsonl record, its numeric fields (`rundir.numeric_fields`), with the
  record's env steps as the step axis: one point per log interval, the same points as
  metrics.jsonl and TensorBoard (`log`, called by `rundir.RunWriter`);
- at the end, learning_curve.png and the videos in RUN_DIR/videos/, when there are any
  (`finish`, called when `tracked` exits).

Each backend is a small class with those three calls (`rundir.Tracker`); `backend(name)`
finds one, and fails in one line naming the extra to install where its package is missing,
before anything starts.
The caller owns the tracked run's lifetime (`tracked`): run.py around its run, tune.py's
trials around each trial, which logs under the sweep's name as its group.

Where they write: wandb's project is $WANDB_PROJECT or "trellis" and its files go into the run
directory unless $WANDB_DIR says otherwise (offline with $WANDB_MODE=offline); MLflow logs to
$MLFLOW_TRACKING_URI (a server, or `file:DIR`, a local file store) under the experiment
$MLFLOW_EXPERIMENT_NAME or "trellis".

A resumed run (`--resume=RUN_DIR`) continues its tracked run: the backend's run id is kept in
RUN_DIR/tracking.json. Its history then holds, a second time, the points the killed part logged
after its last checkpoint (the run directory drops them; MLflow keeps both, wandb ignores steps
below its last); MLflow params keep their first values (it refuses a change), config.json as
an artifact is the resumed run's.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import time
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from trellis.builders.experiments.rundir import CURVE, VIDEOS, Tracker

TRACKERS = ("wandb", "mlflow")
_PROJECT = "trellis"
TRACKED_RUN = "tracking.json"  # In the run directory: {"backend": name, "id": its run's id}.


class TrackingError(ValueError):
    """A tracking backend cannot be used: one line saying what would work."""


def _import(module: str, extra: str) -> types.ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise TrackingError(f"--track={extra} needs the {module} package: pip install -e "
                            f"'.[{extra}]' ({e})") from e


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested settings as {"section.name": text} (MLflow's params are flat strings)."""
    flat: dict[str, str] = {}
    for name, value in config.items():
        key = f"{prefix}{name}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, key + "."))
        else:
            flat[key] = value if isinstance(value, str) else json.dumps(value, default=str)
    return flat


class WandbTracker:
    """A Weights & Biases run (`wandb.init`): config, history, and the files as media.

    Args:
      run_dir: the run directory (its name is the run's; wandb's files go into it).
      group: the run's group (a sweep's name), or None.
      run_id: the id of a wandb run to continue (a resumed run's), or None: a new one.
    """

    def __init__(self, run_dir: str, group: str | None = None, run_id: str | None = None):
        self._wandb = _import("wandb", "wandb")
        self._run = self._wandb.init(
            project=os.environ.get("WANDB_PROJECT", _PROJECT),
            name=os.path.basename(os.path.abspath(run_dir)), group=group,
            dir=os.environ.get("WANDB_DIR", run_dir), reinit="create_new", id=run_id,
            resume=None if run_id is None else "allow")

    @property
    def run_id(self) -> str:
        """The wandb run's id."""
        return str(self._run.id)

    def start(self, config: Mapping[str, Any]) -> None:
        self._run.config.update(dict(config), allow_val_change=True)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._run.log(dict(metrics), step=step)

    def finish(self, curve: str | None, videos: Sequence[str], failed: bool) -> None:
        media: dict[str, Any] = {}
        if curve is not None:
            media["learning_curve"] = self._wandb.Image(curve)
        for path in videos:
            name = os.path.splitext(os.path.basename(path))[0]
            media[f"videos/{name}"] = self._wandb.Video(path, format="mp4")
        if media:
            self._run.log(media)  # At the last step the history holds.
        self._run.finish(exit_code=1 if failed else 0)


class MlflowTracker:
    """An MLflow run (through `MlflowClient`, so that runs in threads or one process after
    another stay apart): the config as params and as config.json, metrics by step, the
    files as artifacts.

    Args:
      run_dir: the run directory (its name is the run's).
      group: the run's group (a sweep's name; the tag `trellis.group`), or None.
      run_id: the id of an MLflow run to continue (a resumed run's), or None: a new one.
    """

    def __init__(self, run_dir: str, group: str | None = None, run_id: str | None = None):
        mlflow = _import("mlflow", "mlflow")
        self._entities = mlflow.entities
        self._client = _mlflow_client(mlflow)
        if run_id is None:
            run_id = self._new_run(os.path.basename(os.path.abspath(run_dir)), group)
        else:
            self._client.update_run(run_id, status="RUNNING")
        self._run_id = run_id

    def _new_run(self, name: str, group: str | None) -> str:
        """A new run `name` in the experiment (made if new), tagged with its group; its id."""
        tags = {} if group is None else {"trellis.group": group}
        return str(self._client.create_run(_mlflow_experiment(self._client), run_name=name,
                                           tags=tags).info.run_id)

    @property
    def run_id(self) -> str:
        """The MLflow run's id."""
        return self._run_id

    def start(self, config: Mapping[str, Any]) -> None:
        settings = {k: v for k, v in config.items() if isinstance(v, Mapping) and k != "run"}
        logged = self._client.get_run(self._run_id).data.params  # A resumed run's, kept.
        params = [self._entities.Param(k, v[:6000]) for k, v in _flatten(settings).items()
                  if k not in logged]
        for i in range(0, len(params), 100):  # log_batch takes at most 100 params.
            self._client.log_batch(self._run_id, params=params[i:i + 100])
        self._client.log_dict(self._run_id, dict(config), "config.json")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        self._client.log_batch(self._run_id, metrics=[
            self._entities.Metric(name, value, now, step) for name, value in metrics.items()])

    def finish(self, curve: str | None, videos: Sequence[str], failed: bool) -> None:
        if curve is not None:
            self._client.log_artifact(self._run_id, curve)
        for path in videos:
            self._client.log_artifact(self._run_id, path, VIDEOS)
        self._client.set_terminated(self._run_id, "FAILED" if failed else "FINISHED")


_BACKENDS: dict[str, Callable[[str, str | None, str | None], Tracker]] = {
    "wandb": WandbTracker, "mlflow": MlflowTracker}


def _mlflow_client(mlflow: types.ModuleType) -> Any:
    """An `MlflowClient` of the tracking URI in the environment. A `file:` URI is MLflow's
    local file store, which MLflow 3 refuses unless $MLFLOW_ALLOW_FILE_STORE is set; asking
    for it by its URI is taken as that opt-in."""
    if os.environ.get("MLFLOW_TRACKING_URI", "").startswith("file:"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return mlflow.MlflowClient()


def _mlflow_experiment(client: Any) -> str:
    """The id of the experiment $MLFLOW_EXPERIMENT_NAME (default: the project's), made if new."""
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME", _PROJECT)
    experiment = client.get_experiment_by_name(name)
    return str(client.create_experiment(name) if experiment is None
               else experiment.experiment_id)


def prepare_sweep(name: str) -> None:
    """Makes, before a sweep's trials start, what their tracked runs share: MLflow's
    experiment, which trials starting at once each made anew in a file store (two experiments
    of one name, each with some of the sweep's runs)."""
    if name == "mlflow":
        _mlflow_experiment(_mlflow_client(_import("mlflow", "mlflow")))


def backend(name: str) -> Callable[[str, str | None, str | None], Tracker]:
    """The tracker class of `name` (one of TRACKERS), its package imported.

    Raises:
      TrackingError: an unknown name, or its package is not installed (naming the extra).
    """
    if name not in _BACKENDS:
        raise TrackingError(f"--track={name} is not a tracker; they are: {', '.join(TRACKERS)}")
    _import(name, name)
    return _BACKENDS[name]


def run_files(run_dir: str) -> tuple[str | None, list[str]]:
    """(learning_curve.png, the videos in RUN_DIR/videos/) as they are now (None, []: none)."""
    curve = os.path.join(run_dir, CURVE)
    videos_dir = os.path.join(run_dir, VIDEOS)
    videos = (sorted(os.path.join(videos_dir, name) for name in os.listdir(videos_dir)
                     if name.endswith(".mp4")) if os.path.isdir(videos_dir) else [])
    return (curve if os.path.exists(curve) else None), videos


@contextlib.contextmanager
def tracked(name: str | None, run_dir: str, group: str | None = None
            ) -> Iterator[Tracker | None]:
    """Inside, a tracked run of `run_dir` with backend `name` (None: no tracking, None given):
    the one RUN_DIR/tracking.json names where it names one of that backend (a resumed run),
    else a new one, whose id it then keeps. On exit its learning curve and videos go out and it
    ends (failed on an exception).

    Raises:
      TrackingError: see `backend`.
    """
    if name is None:
        yield None
        return
    path = os.path.join(run_dir, TRACKED_RUN)
    kept = {}
    if os.path.exists(path):
        with open(path) as f:
            kept = json.load(f)
    tracker = backend(name)(run_dir, group,
                            kept.get("id") if kept.get("backend") == name else None)
    os.makedirs(run_dir, exist_ok=True)
    with open(path, "w") as f:
        json.dump({"backend": name, "id": tracker.run_id}, f)
    failed = True
    try:
        yield tracker
        failed = False
    finally:
        curve, videos = run_files(run_dir)
        tracker.finish(curve, videos, failed)
