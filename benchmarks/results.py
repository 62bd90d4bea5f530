"""The results page, docs/results.md: what each agent reaches on each env, from run directories.

Usage:
  python benchmarks/results.py run [--seeds 1,2,3] [--runs_dir DIR] -- RUN.PY FLAGS
      runs `launch/run.py FLAGS --seed=S` once per seed into RUNS_DIR, then adds them (below)
  python benchmarks/results.py add RUN_DIR [RUN_DIR ...] [--budget N]
      groups the runs by their command (all but --seed, --logdir and --quiet), makes one row
      per group and stores it in docs/results.json, replacing the row of the same command and
      budget; then writes docs/results.md from docs/results.json
  python benchmarks/results.py render
      writes docs/results.md from docs/results.json
Both `run` and `add` take --machine (the machine the runs ran on; this one by default) and
--note (a line printed under the table). The last line printed is the new rows, as JSON
({"rows": [...]}).

A row's score per seed is the training return (the mean over the run's last `return_window`
episodes, metrics.jsonl's return_mean) at the first record at or past the env-step budget
(the runs' own --total_env_steps by default); a population run (anakin's --num_seeds) gives
one score per member. Over the seeds: the interquartile mean (IQM) and its 95%
percentile-bootstrap confidence interval (builders/experiments/aggregate.py; Agarwal et al.
2021, rliable).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from common import run_child

from trellis.builders.experiments.aggregate import bootstrap_ci, interquartile_mean
from trellis.builders.experiments.rundir import (
    COMMAND_LINE,
    CONFIG,
    EXPERIMENT,
    RUN_RECORD,
    SUMMARY,
    read_json,
    read_metrics,
    write_json,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "docs", "results.json")
PAGE = os.path.join(REPO, "docs", "results.md")
# run.py's flags that do not make runs different rows: each seed's own, and where it writes.
_PER_RUN_FLAGS = ("--seed", "--logdir", "--quiet")
# The fewest seeds (scores) in a row: an interquartile mean and an interval need a few.
MIN_SEEDS = 3

# The smoke run of tests/test_benchmarks.py: one seed of a short PPO run, written under the
# test's directory.
SMOKE_FLAGS = ["run", "--seeds=1", "--min_seeds=1", "--runs_dir=runs", "--results=results.json",
               "--page=results.md", "--", "--agent=ppo", "--platform=local_mt",
               "--env=CartPole-v1", "--total_env_steps=3000", "--stop_at_return=none"]


@dataclass(frozen=True)
class Run:
    """What a row needs from one run directory."""

    path: str
    command: tuple[str, ...]  # run.py's flags less _PER_RUN_FLAGS.
    agent: str
    env: str
    platform: str
    seed: int
    total_env_steps: int
    summary: dict[str, Any]
    records: list[dict[str, Any]]
    created: str
    commit: str | None
    jax: str | None


def row_command(argv: Sequence[str]) -> tuple[str, ...]:
    """run.py's flags less those of one seed's run (`_PER_RUN_FLAGS`, as `--f=v`, `--f v` or
    a bare boolean)."""
    kept: list[str] = []
    skip_value = False
    for arg in argv:
        if skip_value:
            skip_value = False
            continue
        name = arg.split("=", 1)[0]
        if name in _PER_RUN_FLAGS:
            # `--seed 3`: its value is the next word (--quiet's, if any, is always `=`).
            skip_value = "=" not in arg and name != "--quiet"
            continue
        kept.append(arg)
    return tuple(kept)


def read_run(path: str) -> Run:
    """The run directory at `path`, read.

    Raises:
      FileNotFoundError: not a finished run directory (no config.json, summary.json or metrics).
    """
    for name in (CONFIG, SUMMARY):
        if not os.path.exists(os.path.join(path, name)):
            raise FileNotFoundError(f"{path} has no {name}: not a finished run directory")
    config = read_json(os.path.join(path, CONFIG))
    record = config.get(RUN_RECORD) or {}
    options, experiment = config[COMMAND_LINE], config[EXPERIMENT]
    records = read_metrics(path)
    if not records:
        raise FileNotFoundError(f"{path} has no metrics records (metrics.jsonl)")
    return Run(path=path, command=row_command(record["sessions"][0]["argv"]),
               agent=options["agent"], env=options["env"], platform=options["platform"],
               seed=experiment["seed"], total_env_steps=experiment["total_env_steps"],
               summary=read_json(os.path.join(path, SUMMARY)), records=records,
               created=record.get("created", ""), commit=record.get("git_commit"),
               jax=(record.get("versions") or {}).get("jax"))


def scores_at(run: Run, budget: int) -> dict[str, float]:
    """The run's training return at the first record at or past `budget` env steps, keyed by
    seed (`S`; `S/member M` for each member of a population).

    Raises:
      ValueError: the run ended short of the budget, or has no return there.
    """
    past = [r for r in run.records if r["env_steps"] >= budget]
    if not past:
        raise ValueError(
            f"{run.path} ended at {run.summary['env_steps']:,} env steps (stopped by "
            f"{run.summary['stopped_by']}), short of the budget {budget:,}: pass a smaller "
            "--budget, or run with --stop_at_return=none")
    record = past[0]
    members = sorted((k for k in record if k.startswith("member/")
                      and k.endswith("/return_mean")), key=lambda k: int(k.split("/")[1]))
    if members:
        scores = {f"{run.seed}/member {k.split('/')[1]}": record[k] for k in members}
    else:
        scores = {str(run.seed): record.get("return_mean")}
    if any(v is None for v in scores.values()):
        raise ValueError(f"{run.path} has no return at {record['env_steps']:,} env steps "
                         "(no episode had ended): pass a larger --budget")
    return scores


def make_row(runs: Sequence[Run], budget: int | None, machine: str, note: str | None,
             min_seeds: int = MIN_SEEDS) -> dict[str, Any]:
    """One row of the table from the runs of one command (its seeds).

    Args:
      runs: run directories of the same command, one per seed.
      budget: env steps at which to read the return; None: the runs' smallest --total_env_steps.
      machine: the machine they ran on, in words.
      note: a line printed under the table, or None.
      min_seeds: the fewest scores a row may have.

    Returns:
      The row, as stored in docs/results.json.

    Raises:
      ValueError: fewer than `min_seeds` scores, or a run short of the budget.
    """
    budget = budget or min(r.total_env_steps for r in runs)
    scores: dict[str, float] = {}
    for run in sorted(runs, key=lambda r: r.seed):
        scores.update(scores_at(run, budget))
    if len(scores) < min_seeds:
        raise ValueError(f"{runs[0].agent} on {runs[0].env} has {len(scores)} scores "
                         f"(seeds {', '.join(scores)}), a row needs {min_seeds}: run more "
                         "seeds of the same command")
    values = list(scores.values())
    low, high = bootstrap_ci(values)
    first = runs[0]
    return {
        "agent": first.agent, "env": first.env, "platform": first.platform,
        "command": list(first.command), "budget": budget, "scores": scores,
        "iqm": round(float(interquartile_mean(values)), 2),
        "ci95": [round(float(low), 2), round(float(high), 2)],
        "wall_time_s": round(statistics.median(r.summary["wall_time_s"] for r in runs), 1),
        "env_steps_per_s": round(statistics.median(r.summary["env_steps_per_s"] for r in runs)),
        "machine": machine, "note": note, "date": min(r.created for r in runs)[:10],
        "commits": sorted({r.commit[:7] for r in runs if r.commit}),
        "jax": sorted({r.jax for r in runs if r.jax}),
    }


def group_runs(runs: Sequence[Run]) -> list[list[Run]]:
    """The runs grouped by command, in the order of each command's first run.

    Raises:
      ValueError: a group holds a seed twice.
    """
    groups: dict[tuple[str, ...], list[Run]] = {}
    for run in runs:
        group = groups.setdefault(run.command, [])
        if any(r.seed == run.seed for r in group):
            raise ValueError(f"{run.path} repeats seed {run.seed} of {group[0].path} (the same "
                             "command): give each run of a row its own --seed")
        group.append(run)
    return list(groups.values())


def merge(rows: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`rows` with each of `new` in place of the row of the same command and budget (appended
    where there is none)."""
    def key(row: dict[str, Any]) -> tuple[tuple[str, ...], int]:
        return tuple(row["command"]), row["budget"]

    replaced = {key(r): r for r in new}
    kept = [replaced.pop(key(r), r) for r in rows]
    return kept + [r for r in new if key(r) in replaced]


def _steps(n: int) -> str:
    for scale, suffix in ((1_000_000, "M"), (1_000, "k")):
        if n >= scale and n % (scale // 1000) == 0:
            return f"{n / scale:g}{suffix}"
    return f"{n:,}"


def render(rows: Sequence[dict[str, Any]]) -> str:
    """docs/results.md's text: the table, its machines, and how each row was made."""
    # Grouped by env, then agent and platform, budgets in order; the store keeps its own order.
    rows = sorted(rows, key=lambda r: (r["env"], r["agent"], r["platform"], r["budget"]))
    machines = list(dict.fromkeys(r["machine"] for r in rows))
    lines = [
        "# Results",
        "",
        "<!-- Written by benchmarks/results.py from docs/results.json: edit neither by hand. -->",
        "",
        "What each agent reaches on each env, over seeds. A score is a run's training return "
        "(the mean over its last `return_window` episodes, metrics.jsonl's `return_mean`) at "
        "the env-step budget; **IQM** is the interquartile mean over the seeds' scores, in "
        "brackets its 95% percentile-bootstrap confidence interval (2,000 resamples of the "
        "seeds), the reporting of Agarwal et al., \"Deep Reinforcement Learning at the Edge "
        "of the Statistical Precipice\" (NeurIPS 2021; their library is "
        "[rliable](https://github.com/google-research/rliable)). With 3 seeds the IQM weighs "
        "the middle score 4 times each outer one, and the interval is wide by nature. Wall "
        "time and env steps/s are the medians over the seeds of the whole runs, to their own "
        "end whatever the row's budget (summary.json: start-up and compilation included), on a "
        "machine that other jobs may have loaded: see each row's note. The engineering log "
        "behind these numbers, and throughput figures, is [benchmarks.md](benchmarks.md).",
        "",
        "| agent | env | platform | env steps | IQM [95% CI] | seed: score | run's wall s | "
        "run's env steps/s | machine |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        scores = ", ".join(f"{s}: {v:g}" for s, v in row["scores"].items())
        low, high = row["ci95"]
        lines.append(
            f"| {row['agent']} | {row['env']} | {row['platform']} | {_steps(row['budget'])} "
            f"| {row['iqm']:g} [{low:g}, {high:g}] | {scores} | {row['wall_time_s']:.1f} | "
            f"{row['env_steps_per_s']:,.0f} | {machines.index(row['machine']) + 1} |")
    lines += ["", "Machines:", ""]
    lines += [f"{i}. {m}" for i, m in enumerate(machines, 1)]
    lines += ["", "## How each row was made", "",
              "Each row's runs, and the row, come back with its command (from the repository "
              "root; the runs go to `--runs_dir`, outside the repository). The commits are "
              "those the runs' config.json recorded (`git_commit`: the checkout's HEAD).", ""]
    for i, row in enumerate(rows, 1):
        seeds = ",".join(dict.fromkeys(s.split("/")[0] for s in row["scores"]))
        command = ["python", "benchmarks/results.py", "run", f"--seeds={seeds}",
                   f"--budget={row['budget']}", "--runs_dir=/tmp/trellis_results", "--",
                   *row["command"]]
        lines.append(f"{i}. {row['agent']} on {row['env']} ({row['platform']}) at "
                     f"{_steps(row['budget'])} env steps, {row['date']}, commit "
                     f"{', '.join(row['commits']) or '?'}, jax {', '.join(row['jax']) or '?'}:")
        lines += ["", f"        {shlex.join(command)}", ""]
        if row.get("note"):
            lines += [f"    {row['note']}", ""]
    lines += ["`python benchmarks/results.py render` writes this page again from "
              "docs/results.json; `python benchmarks/results.py add RUN_DIR ...` makes rows "
              "from run directories you already have (one row per command, its seeds "
              "together).", ""]
    return "\n".join(lines)


def this_machine() -> str:
    """This machine in words: CPU model, cores, memory, GPUs (nvidia-smi's names) or none."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), cpu)
        with open("/proc/meminfo") as f:
            kib = int(next(line.split()[1] for line in f if line.startswith("MemTotal")))
        memory = f", {kib / 2**20:.0f} GiB"
    except OSError:  # Not Linux.
        memory = ""
    try:
        gpus = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.split("\n")
        gpu = ", ".join(g.strip() for g in gpus if g.strip()) or "no GPU"
    except (OSError, subprocess.TimeoutExpired):
        gpu = "no GPU"
    return f"{cpu}, {os.cpu_count()} cores{memory}, {gpu}"


def read_rows(path: str) -> list[dict[str, Any]]:
    """The rows stored at `path` ([] where there is no file yet)."""
    if not os.path.exists(path):
        return []
    rows: list[dict[str, Any]] = read_json(path)["rows"]
    return rows


def add(run_dirs: Sequence[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Rows from `run_dirs`, merged into args.results; writes args.page. Returns the rows."""
    machine = args.machine or this_machine()
    new = [make_row(group, args.budget, machine, args.note, args.min_seeds)
           for group in group_runs([read_run(d) for d in run_dirs])]
    rows = merge(read_rows(args.results), new)
    write_json(args.results, {"rows": rows})
    write_page(rows, args.page)
    return new


def write_page(rows: Sequence[dict[str, Any]], page: str) -> None:
    with open(page, "w") as f:
        f.write(render(rows))


def run_seeds(flags: Sequence[str], seeds: Sequence[int], runs_dir: str) -> list[str]:
    """Runs `launch/run.py FLAGS` once per seed; returns their run directories.

    Raises:
      FileExistsError: a seed's run directory exists (a row is made from fresh runs).
    """
    name = "-".join(a.split("=", 1)[1].replace(":", "_").replace("/", "_") for a in flags
                    if a.split("=", 1)[0] in ("--agent", "--platform", "--env"))
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    dirs = []
    for seed in seeds:
        # Absolute: run.py runs from the repository root, this script from anywhere.
        run_dir = os.path.abspath(os.path.join(runs_dir, f"{name}-{stamp}-seed{seed}"))
        if os.path.exists(run_dir):
            raise FileExistsError(f"{run_dir} exists: a row's runs are made fresh")
        command = [sys.executable, os.path.join(REPO, "launch", "run.py"), *flags,
                   f"--seed={seed}", f"--logdir={run_dir}", "--quiet"]
        print(shlex.join(command), flush=True)
        run_child(command, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        dirs.append(run_dir)
    return dirs


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="results.py", description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["run", "add", "render"])
    p.add_argument("run_dirs", nargs="*", metavar="RUN_DIR", help="add: the run directories")
    p.add_argument("--seeds", default="1,2,3", help="run: the seeds, comma-separated")
    p.add_argument("--runs_dir", default="/tmp/trellis_results",
                   help="run: where the runs go (outside the repository)")
    p.add_argument("--budget", type=int, default=None,
                   help="env steps at which returns are read (default: the runs' "
                   "--total_env_steps)")
    p.add_argument("--machine", default=None,
                   help="the machine the runs ran on, in words (default: this one)")
    p.add_argument("--min_seeds", type=int, default=MIN_SEEDS,
                   help="the fewest seeds (scores) a row may have")
    p.add_argument("--note", default=None, help="a line under the table for these rows")
    p.add_argument("--results", default=RESULTS, help="the rows, as JSON")
    p.add_argument("--page", default=PAGE, help="the page to write")
    argv = list(sys.argv[1:] if argv is None else argv)
    flags = argv[argv.index("--") + 1:] if "--" in argv else []
    args = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    try:
        if args.what == "render":
            write_page(read_rows(args.results), args.page)
            print(args.page)
            return 0
        if args.what == "run":
            if not flags or args.run_dirs:
                p.error("run takes run.py's flags after `--`, and no run directories")
            seeds = [int(s) for s in args.seeds.split(",")]
            run_dirs = run_seeds(flags, seeds, args.runs_dir)
        else:
            if not args.run_dirs:
                p.error("add takes the run directories to read")
            run_dirs = args.run_dirs
        rows = add(run_dirs, args)
    except (FileNotFoundError, FileExistsError, ValueError,
            subprocess.CalledProcessError) as e:
        print(f"results.py: error: {e}", file=sys.stderr)
        return 2
    print(args.page)
    print(json.dumps({"rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
