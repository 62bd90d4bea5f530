"""Programs of programs: sweeps and population-based training of Trellis runs on Ray Tune.

A sweep is a Tune experiment; each trial is one `run_experiment` (a whole Trellis program,
threads by default) with a run directory of its own, SWEEP/trials/TRIAL_ID. The trial reports
the learner node's stats to Tune as they are logged, with each new orbax checkpoint of the
learner. PBT's exploit restarts a trial from another trial's checkpoint with the mutated
settings: the checkpoint becomes the trial's own and the run resumes from it, so params,
optimizer state and counters are the donor's and the hyper-parameters the trial's
(`DataParallelLearner.restore`). Each exploit is a line of the trial's pbt_events.jsonl.
With --track, each trial's run is also tracked (`tracking.tracked`), as run.py's runs are, in
a group named after the sweep's directory; a trial restarted by PBT is a new tracked run.

At the end, SWEEP/sweep.json lists the trials (settings, run directory, final metric,
status) and the best, and SWEEP/sweep.png draws every trial's curve with its exploits.
docs/tuning.md has the details.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import tempfile
import time
from typing import TYPE_CHECKING, Any, TypeVar

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import ray  # noqa: E402
from ray import tune  # noqa: E402
from ray.tune.search import BasicVariantGenerator  # noqa: E402

from trellis.agents.registry import agent_module  # noqa: E402
from trellis.builders.contract.config import ExperimentConfig  # noqa: E402
from trellis.builders.experiments.checkpointing import CHECKPOINT_SUBDIR  # noqa: E402
from trellis.builders.experiments.pbt import Dimension, PBTConfig  # noqa: E402
from trellis.builders.experiments.rundir import read_json, read_metrics, write_json  # noqa: E402
from trellis.builders.experiments.session import run_experiment  # noqa: E402
from trellis.builders.experiments.tracking import prepare_sweep, tracked  # noqa: E402

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# A config dataclass (the experiment's, an agent's).
_Config = TypeVar("_Config", bound="DataclassInstance")

SCHEDULERS = ("fifo", "asha", "pbt")
SEARCH_ALGS = ("random", "grid", "optuna")
SWEEP_JSON, SWEEP_PLOT, TRIALS, TUNE_DIR = "sweep.json", "sweep.png", "trials", "tune"
PBT_EVENTS = "pbt_events.jsonl"
# Beside the orbax step directory in a checkpoint reported to Tune: which trial saved it.
_ORIGIN = "origin.json"


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """Everything a sweep is built from; each trial's settings are these with `search`'s
    draw applied.

    `sweep_dir` must be absolute (Tune's storage path). `metric` is a field of the stats the
    trials report (`mean_return`: over the last `return_window` episodes).
    """

    agent: str
    platform: str
    env_factory: Any  # The env with the command line's env settings (Atari's frame handling).
    options: dict[str, Any]  # The command line's options, as config.json records them.
    experiment: ExperimentConfig
    agent_config: Any
    search: dict[str, Dimension]
    sweep_dir: str
    scheduler: str = "fifo"
    search_alg: str = "random"
    num_trials: int = 4
    max_concurrent: int | None = None
    metric: str = "mean_return"
    mode: str = "max"
    pbt: PBTConfig = PBTConfig()
    ray_address: str | None = None


def with_hparams(spec: SweepSpec, hparams: dict[str, Any]) -> tuple[ExperimentConfig, Any]:
    """The experiment and agent configs of a trial: the spec's, with `hparams` set (each
    in the config that declares it; the configs validate the values)."""
    def apply(config: _Config) -> _Config:
        names = {f.name for f in dataclasses.fields(config)}
        return dataclasses.replace(config, **{k: v for k, v in hparams.items() if k in names})
    return apply(spec.experiment), apply(spec.agent_config)


def _stats_metrics(stats: dict[str, Any]) -> dict[str, Any]:
    """What a trial reports to Tune from the learner node's stats: the numbers."""
    return {k: v for k, v in stats.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


class _Reporter:
    """`run_experiment`'s on_stats: reports each record to Tune, some with the newest
    complete orbax checkpoint of the run.

    Without `pbt_interval`, a record goes with each new checkpoint (for restarts). With it,
    a record goes with the checkpoint each time `pbt_interval` env steps have passed since
    the last one that did: the records where PBT ranks the trial (its perturbation_interval
    in env steps), so the top trials' checkpoints are those PBT exploits, and Tune keeps only
    a few of them.
    """

    def __init__(self, run_dir: str, trial_id: str, metric: str, last_step: int | None,
                 pbt_interval: int | None):
        self._checkpoints = os.path.join(run_dir, CHECKPOINT_SUBDIR)
        self._trial_id, self._metric, self._last_step = trial_id, metric, last_step
        self._pbt_interval = pbt_interval
        self._next_due = (last_step or 0) + (pbt_interval or 0)

    def __call__(self, stats: dict[str, Any]) -> bool:
        metrics = _stats_metrics(stats)
        if metrics.get(self._metric) is None:  # No finished episode yet: nothing to rank.
            return False
        step = latest_step(self._checkpoints)
        if self._pbt_interval is None:
            due = step is not None and step != self._last_step
        else:
            due = step is not None and metrics["env_steps"] >= self._next_due
        if not due:
            tune.report(metrics)
            return False
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copytree(os.path.join(self._checkpoints, str(step)),
                            os.path.join(tmp, str(step)))
            write_json(os.path.join(tmp, _ORIGIN), {"trial_id": self._trial_id, "step": step})
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(tmp))
        self._last_step = step
        self._next_due = metrics["env_steps"] + (self._pbt_interval or 0)
        return False


def latest_step(checkpoints_dir: str) -> int | None:
    """The newest complete checkpoint step in a checkpoints directory (orbax writes into a
    temporary name and renames when done, so a name of digits is complete), or None."""
    if not os.path.isdir(checkpoints_dir):
        return None
    steps = [int(name) for name in os.listdir(checkpoints_dir) if name.isdigit()]
    return max(steps, default=None)


def adopt_checkpoint(checkpoint_dir: str, run_dir: str) -> dict[str, Any]:
    """Makes a checkpoint reported to Tune (possibly another trial's) the only checkpoint of
    `run_dir`, so the run resumes from it; returns its origin {trial_id, step}."""
    origin = read_json(os.path.join(checkpoint_dir, _ORIGIN))
    target = os.path.join(run_dir, CHECKPOINT_SUBDIR)
    shutil.rmtree(target, ignore_errors=True)
    step = str(origin["step"])
    shutil.copytree(os.path.join(checkpoint_dir, step), os.path.join(target, step))
    return origin


def run_trial(hparams: dict[str, Any], spec: SweepSpec) -> None:
    """Tune's function trainable: one Trellis run with `hparams` applied.

    Raises:
      RuntimeError: the run failed (a node's error); Tune marks the trial failed.
    """
    trial_id = tune.get_context().get_trial_id()
    run_dir = os.path.join(spec.sweep_dir, TRIALS, trial_id)
    os.makedirs(run_dir, exist_ok=True)
    experiment, agent_config = with_hparams(spec, hparams)
    checkpoint = tune.get_checkpoint()
    origin = None
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            origin = adopt_checkpoint(directory, run_dir)
        if origin["trial_id"] != trial_id:  # PBT's exploit (not a restart of this trial).
            with open(os.path.join(run_dir, PBT_EVENTS), "a") as f:
                f.write(json.dumps({"time": round(time.time(), 3), "env_steps": origin["step"],
                                    "donor": origin["trial_id"], "hparams": hparams}) + "\n")
    # Tracked (--track) as a run of its own in the sweep's group, named by the trial.
    with tracked(spec.options.get("track"), run_dir,
                 group=os.path.basename(spec.sweep_dir)) as tracker:
        summary = run_experiment(
            agent_module(spec.agent).Builder(agent_config), spec.env_factory, experiment,
            run_dir, platform=spec.platform, quiet=True, resume=origin is not None,
            options=spec.options,
            on_stats=_Reporter(run_dir, trial_id, spec.metric,
                               None if origin is None else origin["step"],
                               spec.pbt.pbt_interval if spec.scheduler == "pbt" else None),
            tracker=tracker)
    if summary["exit_code"] == 1:
        raise RuntimeError(f"trial {trial_id}: {summary.get('error')}")
    final = {"env_steps": summary["env_steps"], "learner_steps": summary["learner_steps"],
             "episodes": summary["episodes"], "wall_time_s": summary["wall_time_s"]}
    if summary["mean_return"] is not None:
        final["mean_return"] = summary["mean_return"]
    tune.report(final)


def _domain(dimension: Dimension) -> Any:
    kind, values = dimension.kind, dimension.values
    if kind == "grid":
        return tune.grid_search(list(values))
    if kind == "choice":
        return tune.choice(list(values))
    if kind == "randint":
        return tune.randint(values[0], values[1] + 1)  # Inclusive, as the spec reads.
    return getattr(tune, kind)(*values)


def _mutation(dimension: Dimension) -> Any:
    """What PBT's explore resamples from; grids are lists it steps through."""
    return list(dimension.values) if dimension.kind in ("grid", "choice") else _domain(dimension)


def _scheduler(spec: SweepSpec) -> Any:
    if spec.scheduler == "asha":
        return tune.schedulers.ASHAScheduler(
            time_attr="env_steps", max_t=spec.experiment.total_env_steps,
            grace_period=max(1, spec.experiment.total_env_steps // 10))
    if spec.scheduler == "pbt":
        p = spec.pbt
        return tune.schedulers.PopulationBasedTraining(
            time_attr="env_steps", perturbation_interval=p.pbt_interval,
            quantile_fraction=p.pbt_quantile, resample_probability=p.pbt_resample_probability,
            perturbation_factors=(max(p.pbt_perturb), min(p.pbt_perturb)),
            hyperparam_mutations={k: _mutation(d) for k, d in spec.search.items()})
    return tune.schedulers.FIFOScheduler()


def _search_alg(spec: SweepSpec) -> Any:
    """Seeded by the experiment's seed, so two sweeps with one seed start from the same draws
    (e.g. the same learning rates with and without PBT)."""
    if spec.search_alg != "optuna":
        return BasicVariantGenerator(random_state=spec.experiment.seed,  # Grids crossed.
                                     max_concurrent=spec.max_concurrent or 0)
    from ray.tune.search.optuna import OptunaSearch  # Needs optuna: the `optuna` extra.

    return OptunaSearch(seed=spec.experiment.seed)


def _tuner(spec: SweepSpec) -> tune.Tuner:
    trainable = tune.with_resources(tune.with_parameters(run_trial, spec=spec), {"cpu": 1})
    grid = any(d.kind == "grid" for d in spec.search.values())
    tune_config = tune.TuneConfig(
        metric=spec.metric, mode=spec.mode, scheduler=_scheduler(spec),
        search_alg=_search_alg(spec),
        # A grid is run whole once per sample; without one, each sample is a trial.
        num_samples=1 if grid and spec.search_alg == "grid" else spec.num_trials,
        # Tune limits a Searcher (optuna) itself; the random generator is limited above.
        max_concurrent_trials=spec.max_concurrent if spec.search_alg == "optuna" else None,
        trial_dirname_creator=lambda trial: trial.trial_id)
    run_config = tune.RunConfig(
        name=TUNE_DIR, storage_path=spec.sweep_dir, verbose=0,
        failure_config=tune.FailureConfig(max_failures=0),
        # A few per trial: PBT's exploit may pick a donor's checkpoint a little behind.
        checkpoint_config=tune.CheckpointConfig(num_to_keep=4))
    return tune.Tuner(trainable, param_space={k: _domain(d) for k, d in spec.search.items()},
                      tune_config=tune_config, run_config=run_config)


def run_sweep(spec: SweepSpec, restore: bool = False) -> dict[str, Any]:
    """Runs the sweep (or, with `restore`, resumes the one interrupted in `spec.sweep_dir`,
    Tune's restore) and returns what sweep.json holds."""
    os.makedirs(spec.sweep_dir, exist_ok=True)
    if spec.options.get("track") is not None:
        prepare_sweep(spec.options["track"])
    # Trials report every log interval and checkpoint often (PBT needs it): Tune's warnings
    # about that are noise here.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    os.environ.setdefault("TUNE_WARN_THRESHOLD_S", "5")
    started_ray = not ray.is_initialized()
    if started_ray:
        # Enough logical CPUs for the concurrent trials asked for (they share the cores).
        num_cpus = None if spec.ray_address else max(os.cpu_count() or 1,
                                                     spec.max_concurrent or 1)
        ray.init(address=spec.ray_address or "local", num_cpus=num_cpus,
                 include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        if restore:
            tuner = tune.Tuner.restore(
                os.path.join(spec.sweep_dir, TUNE_DIR),
                trainable=tune.with_resources(tune.with_parameters(run_trial, spec=spec),
                                              {"cpu": 1}),
                resume_unfinished=True, resume_errored=True)
        else:
            tuner = _tuner(spec)
        results = tuner.fit()
        # By index: ResultGrid has __len__ and __getitem__, and no __iter__ in its annotations.
        trials = [_trial_record(spec, results[i]) for i in range(len(results))]
    finally:
        if started_ray:
            ray.shutdown()
    summary = summarize(trials, spec.metric, spec.mode)
    write_json(os.path.join(spec.sweep_dir, SWEEP_JSON), summary)
    plot_sweep(spec.sweep_dir, summary["trials"])
    return summary


def _trial_record(spec: SweepSpec, result: tune.Result) -> dict[str, Any]:
    trial_id = os.path.basename(result.path)
    metrics = result.metrics or {}
    return {"trial_id": trial_id, "hparams": dict(result.config or {}),
            "run_dir": os.path.join(spec.sweep_dir, TRIALS, trial_id),
            "metric": metrics.get(spec.metric), "env_steps": metrics.get("env_steps"),
            "status": "failed" if result.error is not None else "completed",
            "error": None if result.error is None else str(result.error).splitlines()[0][:300]}


def summarize(trials: list[dict[str, Any]], metric: str, mode: str) -> dict[str, Any]:
    """sweep.json: the trials sorted by id, and `best`, the completed trial with the best
    final `metric` (None when none has one)."""
    trials = sorted(trials, key=lambda t: t["trial_id"])
    ranked = [t for t in trials if t["status"] == "completed" and _finite(t["metric"])]
    sign = 1 if mode == "max" else -1
    best = max(ranked, key=lambda t: sign * t["metric"], default=None)
    return {"metric": metric, "mode": mode, "trials": trials, "best": best}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def read_events(run_dir: str) -> list[dict[str, Any]]:
    """A trial's PBT exploits, oldest first."""
    path = os.path.join(run_dir, PBT_EVENTS)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_sweep(sweep_dir: str, trials: list[dict[str, Any]]) -> str:
    """SWEEP/sweep.png: each trial's mean return vs env steps, its exploits marked x."""
    fig, ax = plt.subplots(figsize=(8, 5))
    for trial in trials:
        records = [r for r in read_metrics(trial["run_dir"]) if r.get("return_mean") is not None]
        if not records:
            continue
        steps = [r["env_steps"] for r in records]
        line, = ax.plot(steps, [r["return_mean"] for r in records], label=trial["trial_id"])
        for event in read_events(trial["run_dir"]):
            before = [r for r in records if r["env_steps"] <= event["env_steps"]]
            y = before[-1]["return_mean"] if before else records[0]["return_mean"]
            ax.plot(event["env_steps"], y, "x", color=line.get_color(), markersize=9)
    ax.set_xlabel("env steps")
    ax.set_ylabel("mean return")
    ax.set_title("trials (x: PBT exploit)")
    if ax.lines:
        ax.legend(fontsize=7)
    path = os.path.join(sweep_dir, SWEEP_PLOT)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
