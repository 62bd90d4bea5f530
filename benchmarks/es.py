"""Evolution strategies (OpenAI-ES) on CartPole-v1: anakin (gymnax) and local_mp (Gymnasium).

Usage: python benchmarks/es.py [--seeds 0,1,2] [--target 475] [--population 256]
       [--workers 2] [--budget 5000000] [--no_local_mp]

Every figure comes from `launch/run.py --agent=es` started as a user starts it (process
start, imports and compilation included), read back from its run directory:
  (a) --platform=anakin --env=gymnax:CartPole-v1: per seed, the wall time from launch to a
      mean return of TARGET over the last 100 episodes (summary.json's wall_time_s), the
      generations and env steps it took, env steps/s (the whole session, and the steady rate
      after the first compiled call), and the fitness curve (generation, mean, best). The
      first run compiles with an empty compilation cache (cold); later seeds use the cache
      it left (warm), as a user's second run does.
  (b) --platform=local_mp --env=CartPole-v1 with --num_actors=WORKERS env workers: the same.
Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from common import rounded, run_child

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The flags of this script's smoke run in the default test suite (tests/test_benchmarks.py):
# its main path on a budget of seconds.
SMOKE_FLAGS = ["--seeds=0", "--target=40", "--population=16", "--budget=20000",
               "--no_local_mp"]


def run(runs: str, population: int, target: float, budget: int, seed: int,
        *flags: str) -> dict:
    """One run.py process, its run directory in `runs` (where the runs share the
    compilation cache): its summary and its fitness curve."""
    logdir = tempfile.mkdtemp(dir=runs)
    cmd = [sys.executable, os.path.join(REPO, "launch", "run.py"), "--agent=es", "--quiet",
           f"--logdir={logdir}", f"--population_size={population}", f"--seed={seed}",
           f"--stop_at_return={target}", f"--total_env_steps={budget}",
           "--log_every_s=0.05", *flags]
    run_child(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    with open(os.path.join(logdir, "summary.json")) as f:
        summary = json.load(f)
    curve = {}
    with open(os.path.join(logdir, "metrics.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            if "learner/fitness_mean" in record:  # From the first told generation on.
                curve[int(record["learner/generation"])] = (
                    round(record["learner/fitness_mean"], 1),
                    round(record["learner/fitness_max"], 1))
    return {
        "seed": seed,
        "reached": summary["stopped_by"] == "return_target",
        "wall_time_s": summary["wall_time_s"],
        "generations": summary["learner_steps"],
        "env_steps": summary["env_steps"],
        "env_steps_per_s": summary["env_steps_per_s"],
        "steady_env_steps_per_s": summary.get("steady_env_steps_per_s"),
        "mean_return": summary["mean_return"],
        # [generation, mean fitness, best fitness] as recorded (most generations).
        "fitness_curve": [[g, *curve[g]] for g in sorted(curve)],
    }


def platform_runs(runs: str, seeds: list[int], args: argparse.Namespace,
                  *flags: str) -> dict:
    results = [run(runs, args.population, args.target, args.budget, seed, *flags)
               for seed in seeds]
    reached = [r for r in results if r["reached"]]
    return {
        "runs": results,
        "reached": f"{len(reached)}/{len(results)}",
        "cold_wall_time_s": results[0]["wall_time_s"],  # The first run compiles afresh.
        "median_wall_time_s": rounded(statistics.median(r["wall_time_s"] for r in reached))
        if reached else None,
        "median_generations": statistics.median(r["generations"] for r in reached)
        if reached else None,
        "median_env_steps_per_s": rounded(statistics.median(
            r["env_steps_per_s"] for r in results)),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--target", type=float, default=475.0)
    p.add_argument("--population", type=int, default=256)
    p.add_argument("--workers", type=int, default=2, help="local_mp env workers")
    p.add_argument("--budget", type=int, default=5_000_000, help="env steps at most per run")
    p.add_argument("--no_local_mp", action="store_true")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    out: dict = {"target": args.target, "population": args.population}
    with tempfile.TemporaryDirectory(prefix="es-bench-") as runs:
        platforms = {"anakin": ["--platform=anakin", "--env=gymnax:CartPole-v1"]}
        if not args.no_local_mp:
            platforms["local_mp"] = ["--platform=local_mp", "--env=CartPole-v1",
                                     f"--num_actors={args.workers}"]
        for name, flags in platforms.items():
            os.makedirs(os.path.join(runs, name))  # Each platform's own compilation cache.
            out[name] = platform_runs(os.path.join(runs, name), seeds, args, *flags)
    for name in ("anakin", "local_mp"):
        if name not in out:
            continue
        print(f"{name}: reached {out[name]['reached']}")
        for r in out[name]["runs"]:
            print(f"  seed {r['seed']}: {r['wall_time_s']:.1f} s from launch, "
                  f"{r['generations']} generations, {r['env_steps']:,d} env steps, "
                  f"{r['env_steps_per_s']:,.0f} env steps/s (steady "
                  f"{r['steady_env_steps_per_s'] or 0:,.0f}), mean return {r['mean_return']}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
