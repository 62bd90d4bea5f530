"""IMPALA on local_mp against Stable-Baselines3's A2C on CartPole-v1: env steps/s and time to
a mean return of 450, start-up included.

Usage: python benchmarks/compare.py [--seeds 1,2,3] [--target 450] [--sb3_venv DIR]

Runs, one after the other as children of this process: `launch/run.py --agent=impala
--platform=local_mp --stop_at_return=TARGET` (run.py's defaults otherwise), then SB3's A2C with
the RL Baselines3 Zoo's settings for CartPole-v1 (8 envs in a DummyVecEnv, MlpPolicy,
ent_coef 0, SB3's defaults otherwise; at most the zoo's 500k steps), stopped when the mean
return of its last 100 episodes reaches TARGET, the window IMPALA's stop rule uses. Each side's
time is measured here, from starting its process to its exit, so interpreter start, imports
and compilation count; env steps/s is its env steps over that time.

SB3 and PyTorch are never dependencies of Trellis: they go into a throw-away virtual
environment that this script creates and deletes (or DIR, created once and kept, to rerun).
Prints one line per run, the medians and their ratios, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from common import rounded

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SB3_PACKAGES = ["stable-baselines3>=2.3"]

# Runs in the SB3 environment: A2C with the zoo's CartPole-v1 settings until the mean return of
# the last 100 episodes (SB3's ep_info_buffer) reaches the target, or the zoo's step budget.
SB3_SCRIPT = """
import json, sys
from stable_baselines3 import A2C
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

target, seed = float(sys.argv[1]), int(sys.argv[2])

class StopAtMeanReturn(BaseCallback):
    def _on_step(self):
        episodes = self.model.ep_info_buffer
        return not (len(episodes) == episodes.maxlen
                    and sum(e["r"] for e in episodes) / len(episodes) >= target)

model = A2C("MlpPolicy", make_vec_env("CartPole-v1", n_envs=8, seed=seed), ent_coef=0.0,
            seed=seed, device="cpu")
model.learn(total_timesteps=500_000, callback=StopAtMeanReturn())
episodes = model.ep_info_buffer
mean = sum(e["r"] for e in episodes) / max(len(episodes), 1)
print(json.dumps({"env_steps": int(model.num_timesteps), "mean_return": mean,
                  "reached": len(episodes) == episodes.maxlen and mean >= target}))
"""


def timed(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    start = time.monotonic()
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} exited with {out.returncode}:\n{out.stderr[-3000:]}")
    return time.monotonic() - start, out


def impala(seed: int, target: float) -> dict:
    with tempfile.TemporaryDirectory() as logdir:
        wall_s, _ = timed([sys.executable, os.path.join(REPO, "launch", "run.py"),
                           "--agent=impala", "--platform=local_mp", f"--seed={seed}",
                           f"--stop_at_return={target}", f"--logdir={logdir}/run", "--quiet"])
        with open(os.path.join(logdir, "run", "summary.json")) as f:
            s = json.load(f)
    return {"wall_s": wall_s, "env_steps": s["env_steps"], "mean_return": s["mean_return"],
            "reached": s["stopped_by"] == "return_target"}


def sb3_a2c(python: str, seed: int, target: float) -> dict:
    wall_s, out = timed([python, "-c", SB3_SCRIPT, str(target), str(seed)])
    return {"wall_s": wall_s, **json.loads(out.stdout.strip().splitlines()[-1])}


def make_sb3_venv(directory: str) -> str:
    """A virtual environment with SB3 (and PyTorch) in `directory`; returns its python."""
    python = os.path.join(directory, "bin", "python")
    if not os.path.exists(python):
        subprocess.run([sys.executable, "-m", "venv", directory], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", *SB3_PACKAGES], check=True)
    return python


def summarize(runs: list[dict]) -> dict:
    """Medians over seeds: wall time to the target (start-up included) and env steps/s."""
    return {"runs": runs, "reached": f"{sum(r['reached'] for r in runs)}/{len(runs)}",
            "median_wall_s": statistics.median(r["wall_s"] for r in runs),
            "median_env_steps_per_s": statistics.median(r["env_steps"] / r["wall_s"]
                                                        for r in runs)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--target", type=float, default=450.0)
    p.add_argument("--sb3_venv", default=None,
                   help="keep SB3's environment here (created if missing) instead of a "
                        "temporary one")
    args = p.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    venv = args.sb3_venv or tempfile.mkdtemp(prefix="trellis-sb3-")
    results: dict = {"target": args.target, "seeds": seeds}
    try:
        python = make_sb3_venv(venv)
        print(f"{'':<14}{'seed':>5}{'reached':>9}{'wall s':>9}{'env steps':>11}{'steps/s':>10}",
              flush=True)
        for name, run in (("impala_local_mp", lambda s: impala(s, args.target)),
                          ("sb3_a2c", lambda s: sb3_a2c(python, s, args.target))):
            runs = []
            for seed in seeds:
                r = run(seed)
                runs.append(r)
                print(f"{name:<14}{seed:>5}{str(r['reached']):>9}{r['wall_s']:>9.1f}"
                      f"{r['env_steps']:>11,d}{r['env_steps'] / r['wall_s']:>10,.0f}", flush=True)
            results[name] = summarize(runs)
    finally:
        if args.sb3_venv is None:
            shutil.rmtree(venv, ignore_errors=True)
    ours, theirs = results["impala_local_mp"], results["sb3_a2c"]
    results["ratios"] = {
        "env_steps_per_s": ours["median_env_steps_per_s"] / theirs["median_env_steps_per_s"],
        "time_to_target": theirs["median_wall_s"] / ours["median_wall_s"]}
    print(f"median env steps/s: IMPALA {ours['median_env_steps_per_s']:,.0f}, "
          f"SB3 A2C {theirs['median_env_steps_per_s']:,.0f} "
          f"(x{results['ratios']['env_steps_per_s']:.1f}); median time to {args.target:g}: "
          f"IMPALA {ours['median_wall_s']:.1f} s ({ours['reached']} reached), SB3 A2C "
          f"{theirs['median_wall_s']:.1f} s ({theirs['reached']} reached; "
          f"x{results['ratios']['time_to_target']:.1f})")
    print(json.dumps(rounded(results)))


if __name__ == "__main__":
    main()
