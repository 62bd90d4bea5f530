"""PPO on CartPole-v1 with the anakin platform (gymnax) against local_mp (Gymnasium).

Usage: python benchmarks/anakin.py [--seeds 0,1,2] [--target 450] [--num_seeds 1,8,64]
       [--population_env_steps 1000000] [--steady_env_steps 5000000] [--repeats 3]
       [--no_local_mp]

Every figure comes from `launch/run.py` started as a user starts it (process start, imports
and compilation included), read back from its summary.json:
  (a) wall time from launch to mean return TARGET, per seed: the first run with an empty
      compilation cache (cold), then each seed with the cache it left (warm), median of those;
  (b) steady-state env steps/s of learning (after the first compiled call), from runs to a
      fixed budget with no target (median of --repeats runs: a shared machine's speed varies);
  (c) populations of N members (--num_seeds=N) to TARGET, at most a budget of env steps per
      member: aggregate steady env steps/s (median of --repeats runs), its ratio to (b)'s,
      and the fraction of members whose last `return_window` episodes average at least
      TARGET at the end;
  (d) the same agent on Gymnasium's CartPole-v1 with --platform=local_mp, to TARGET.
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

from common import cpu_count, rounded, run_child

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The flags of this script's smoke run in the default test suite (tests/test_benchmarks.py):
# its main path on a budget of seconds.
SMOKE_FLAGS = ["--seeds=0", "--target=15", "--num_seeds=1", "--population_env_steps=25000",
               "--steady_env_steps=25000", "--repeats=1", "--no_local_mp"]


def run(runs: str, *flags: str) -> dict:
    """One run.py process with its run directory in `runs` (where the runs share the
    compilation cache); its summary.json."""
    logdir = tempfile.mkdtemp(dir=runs)
    cmd = [sys.executable, os.path.join(REPO, "launch", "run.py"), "--agent=ppo", "--quiet",
           f"--logdir={logdir}", *flags]
    run_child(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    with open(os.path.join(logdir, "summary.json")) as f:
        return json.load(f)


def anakin(runs: str, *flags: str) -> dict:
    return run(runs, "--platform=anakin", "--env=gymnax:CartPole-v1", *flags)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--target", type=float, default=450.0)
    p.add_argument("--num_seeds", default="1,8,64", help="population sizes for (c)")
    p.add_argument("--population_env_steps", type=int, default=1_000_000,
                   help="(c): env-step budget per member")
    p.add_argument("--steady_env_steps", type=int, default=5_000_000, help="(b): budget")
    p.add_argument("--repeats", type=int, default=3,
                   help="runs of (b) and of each (c), whose medians are compared")
    p.add_argument("--no_local_mp", action="store_true", help="skip (d)")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    target = f"--stop_at_return={args.target}"
    out: dict = {"cpus": cpu_count(), "target": args.target}
    with tempfile.TemporaryDirectory() as runs:
        print(f"{'run':<34}{'stopped by':>14}{'wall s':>8}{'env steps':>12}{'steps/s':>12}"
              f"{'steady/s':>12}{'return':>8}{'solved':>8}", flush=True)

        def row(name: str, s: dict) -> dict:
            solved = s.get("solved_fraction")
            print(f"{name:<34}{s['stopped_by']:>14}{s['wall_time_s']:>8.2f}"
                  f"{s['env_steps']:>12,d}{s['env_steps_per_s']:>12,.0f}"
                  f"{s.get('steady_env_steps_per_s', 0):>12,.0f}{s['mean_return'] or 0:>8.1f}"
                  f"{'' if solved is None else f'{solved:.2f}':>8}", flush=True)
            members = s.get("members", [])
            return {**{k: s.get(k) for k in ("stopped_by", "wall_time_s", "env_steps",
                                             "env_steps_per_s", "steady_env_steps_per_s",
                                             "mean_return")},
                    # A count, not a fraction: the JSON line rounds floats to 0.1.
                    "solved": f"{sum(bool(m['solved']) for m in members)}/{len(members)}"
                    if members and members[0]["solved"] is not None else None}

        cold = row(f"(a) seed {seeds[0]}, cold cache", anakin(runs, target, f"--seed={seeds[0]}"))
        warm = [row(f"(a) seed {seed}, warm cache", anakin(runs, target, f"--seed={seed}"))
                for seed in seeds]
        out["time_to_target"] = {
            "cold": cold, "warm": warm,
            "median_warm_wall_time_s": statistics.median(r["wall_time_s"] for r in warm),
            "solved": f"{sum(r['stopped_by'] == 'return_target' for r in warm)}/{len(warm)}"}
        steady = [row(f"(b) steady, 1 seed, run {i + 1}", anakin(
            runs, "--stop_at_return=none", f"--total_env_steps={args.steady_env_steps}"))
            for i in range(args.repeats)]
        base = statistics.median(r["steady_env_steps_per_s"] for r in steady)
        if not base:  # Every env step came in the first compiled call: no steady rate.
            raise SystemExit("anakin.py: no steady rate for (b); give --steady_env_steps "
                             "more than one compiled call's env steps")
        out["steady"] = {"runs": steady, "median_steady_env_steps_per_s": base}
        population = {}
        for n in (int(x) for x in args.num_seeds.split(",")):
            runs_n = [row(f"(c) --num_seeds={n}, run {i + 1}", anakin(
                runs, f"--num_seeds={n}", target,
                f"--total_env_steps={args.population_env_steps}"))
                for i in range(args.repeats)]
            median = statistics.median(r["steady_env_steps_per_s"] for r in runs_n)
            population[n] = {"runs": runs_n, "median_steady_env_steps_per_s": median,
                             "speedup_vs_1": median / base}
        out["population"] = population
        print(f"(b) median steady env steps/s of one seed: {base:,.0f}; (c) median aggregate "
              "steady env steps/s, and its ratio to (b): " + ", ".join(
                  f"N={n}: {r['median_steady_env_steps_per_s']:,.0f} ({r['speedup_vs_1']:.2f}x)"
                  for n, r in population.items()), flush=True)
        if not args.no_local_mp:  # Beside the anakin runs: the same compilation cache.
            out["local_mp_gymnasium"] = [row(f"(d) local_mp Gymnasium, seed {seed}",
                                             run(runs, "--platform=local_mp", "--env=CartPole-v1",
                                                 target, f"--seed={seed}")) for seed in seeds]
    print(json.dumps(rounded(out)))


if __name__ == "__main__":
    main()
