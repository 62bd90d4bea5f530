"""Wall time and env steps/s to solve CartPole-v1 with run.py's defaults, over seeds.

Usage: python benchmarks/time_to_solve.py [--agent impala] [--platforms local_mp,local_mt]
       [--seeds 1,2,3] [--target 450] [--memory] [-- extra run.py flags]
Runs `launch/run.py --stop_at_return=TARGET` once per platform and seed (the same command a
user types, start-up included), prints a table with the medians, then one JSON line.
With --memory, runs each entry of MEMORY_AGENTS on the memory task CartPoleNoVel-v1 instead
(best return: the highest mean over the return window along the run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from common import run_child

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The flags of this script's smoke run in the default test suite (tests/test_benchmarks.py):
# its main path on a budget of seconds.
SMOKE_FLAGS = ["--platforms=local_mt", "--seeds=1", "--target=15", "--", "--return_window=10",
               "--total_env_steps=5000"]

MEMORY_ENV = "CartPoleNoVel-v1"
# The agents of the memory benchmark (docs/benchmarks.md) and their run.py flags. The
# feed-forward IMPALA is the baseline that cannot solve it: its env-step budget ends its runs.
MEMORY_AGENTS = {
    "impala": ["--agent=impala", "--total_env_steps=1000000"],
    "impala-lstm": ["--agent=impala", "--core=lstm"],
}


def solve(flags: list[str], platform: str, seed: int, target: float, extra: list[str]) -> dict:
    """One run.py run; its summary, with `best_return` read from its metrics."""
    with tempfile.TemporaryDirectory() as logdir:
        cmd = [sys.executable, os.path.join(REPO, "launch", "run.py"), *flags,
               f"--platform={platform}", f"--seed={seed}", f"--stop_at_return={target}",
               f"--logdir={logdir}", "--quiet", *extra]
        run_child(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        with open(os.path.join(logdir, "summary.json")) as f:
            summary = json.load(f)
        with open(os.path.join(logdir, "metrics.jsonl")) as f:
            returns = [r["return_mean"] for r in map(json.loads, f)
                       if r.get("return_mean") is not None]
        summary["best_return"] = max(returns, default=None)
        return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agent", default="impala", help="an --agent of run.py")
    p.add_argument("--platforms", default="local_mp,local_mt")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--target", type=float, default=450.0)
    p.add_argument("--memory", action="store_true",
                   help=f"run MEMORY_AGENTS on {MEMORY_ENV} instead of --agent")
    args, extra = p.parse_known_args()
    extra = [a for a in extra if a != "--"]
    if args.memory:
        suites = {name: flags + [f"--env={MEMORY_ENV}"] for name, flags in MEMORY_AGENTS.items()}
    else:
        suites = {args.agent: [f"--agent={args.agent}"]}
    results = {name: run_suite(flags, args, extra) for name, flags in suites.items()}
    print(json.dumps(results if args.memory else results[args.agent]))


def run_suite(flags: list[str], args: argparse.Namespace, extra: list[str]) -> dict:
    """Every platform and seed of one agent's command; prints its rows and medians."""
    results: dict = {"flags": flags, "target": args.target, "extra_flags": extra}
    print(f"{' '.join(flags)}\n{'platform':<10}{'seed':>6}{'stopped by':>15}{'wall s':>9}"
          f"{'env steps':>11}{'steps/s':>10}{'return':>8}{'best':>8}", flush=True)
    for platform in args.platforms.split(","):
        runs = []
        for seed in (int(s) for s in args.seeds.split(",")):
            s = solve(flags, platform, seed, args.target, extra)
            runs.append(s)
            print(f"{platform:<10}{seed:>6}{s['stopped_by']:>15}{s['wall_time_s']:>9.1f}"
                  f"{s['env_steps']:>11,d}{s['env_steps_per_s']:>10,.0f}"
                  f"{s['mean_return']:>8.1f}{s['best_return']:>8.1f}", flush=True)
        solved = [r for r in runs if r["stopped_by"] == "return_target"]
        results[platform] = {
            "runs": [{k: r[k] for k in ("stopped_by", "wall_time_s", "env_steps",
                                         "env_steps_per_s", "mean_return", "best_return")}
                     for r in runs],
            "solved": f"{len(solved)}/{len(runs)}",
            "median_wall_time_s": statistics.median(r["wall_time_s"] for r in runs),
            "median_env_steps_per_s": statistics.median(r["env_steps_per_s"] for r in runs),
            "median_env_steps": statistics.median(r["env_steps"] for r in runs),
        }
        m = results[platform]
        print(f"{platform:<10}{'median':>6}{m['solved'] + ' solved':>15}"
              f"{m['median_wall_time_s']:>9.1f}{m['median_env_steps']:>11,.0f}"
              f"{m['median_env_steps_per_s']:>10,.0f}", flush=True)
    return results


if __name__ == "__main__":
    main()
