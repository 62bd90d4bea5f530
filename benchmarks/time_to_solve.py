"""Wall time and env steps/s to solve CartPole-v1 with run.py's defaults, over seeds.

Usage: python benchmarks/time_to_solve.py [--agent impala] [--platforms local_mp,local_mt]
       [--seeds 1,2,3] [--target 450] [-- extra run.py flags]
Runs `launch/run.py --stop_at_return=TARGET` once per platform and seed (the same command a
user types, start-up included), prints a table with the medians, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def solve(agent: str, platform: str, seed: int, target: float, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as logdir:
        cmd = [sys.executable, os.path.join(REPO, "launch", "run.py"), f"--agent={agent}",
               f"--platform={platform}", f"--seed={seed}", f"--stop_at_return={target}",
               f"--logdir={logdir}", "--quiet", *extra]
        subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        with open(os.path.join(logdir, "summary.json")) as f:
            return json.load(f)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agent", default="impala", help="an --agent of run.py")
    p.add_argument("--platforms", default="local_mp,local_mt")
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--target", type=float, default=450.0)
    args, extra = p.parse_known_args()
    extra = [a for a in extra if a != "--"]
    results: dict = {"agent": args.agent, "target": args.target, "extra_flags": extra}
    print(f"{'platform':<10}{'seed':>6}{'stopped by':>15}{'wall s':>9}{'env steps':>11}"
          f"{'steps/s':>10}{'return':>8}", flush=True)
    for platform in args.platforms.split(","):
        runs = []
        for seed in (int(s) for s in args.seeds.split(",")):
            s = solve(args.agent, platform, seed, args.target, extra)
            runs.append(s)
            print(f"{platform:<10}{seed:>6}{s['stopped_by']:>15}{s['wall_time_s']:>9.1f}"
                  f"{s['env_steps']:>11,d}{s['env_steps_per_s']:>10,.0f}"
                  f"{s['mean_return']:>8.1f}", flush=True)
        solved = [r for r in runs if r["stopped_by"] == "return_target"]
        results[platform] = {
            "runs": [{k: r[k] for k in ("stopped_by", "wall_time_s", "env_steps",
                                         "env_steps_per_s", "mean_return")}
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
    print(json.dumps(results))


if __name__ == "__main__":
    main()
