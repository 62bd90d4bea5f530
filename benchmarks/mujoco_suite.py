"""The MuJoCo suite on the host: an off-policy agent on a Gymnasium MuJoCo env, its learning
curve, its final deterministic return, env steps/s and wall time from launch.

Usage: python benchmarks/mujoco_suite.py [--agent=sac] [--env=HalfCheetah-v5] [--budget=ENV_STEPS]
       [--target=R] [--eval_every=ENV_STEPS] [--final_episodes=N] [--logdir=DIR] [run.py flags]

`launch/run.py --platform=local_mp` is started as a user starts it, with the env's preset
(`--preset=mujoco`, chosen by itself for these envs: RL Baselines3 Zoo's and CleanRL's settings,
docs/presets.md), a greedy evaluation every `eval_every` env steps (the zoo's references are
deterministic evaluations) and the env-step budget. After it, `launch/evaluate.py` plays the
final checkpoint greedily for `final_episodes` (10). The curve is the training return (the
stochastic policy's, over the return window) and the evaluations' (greedy); `target_reached_at`
is the first evaluation at or above `--target` (its env steps and the wall time from launch).
The references (RL Baselines3 Zoo's benchmark.md, v3 envs, 1M env steps): SAC HalfCheetah
9,535, Hopper 2,326, Walker2d 3,863, Ant 4,616; Humanoid 6,232 at 2M.
Extra flags go to run.py (and override the preset's). Prints a summary, then one JSON line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from common import rounded, run_child

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULTS = {"agent": "sac", "env": "HalfCheetah-v5", "budget": 300_000, "target": None,
            "eval_every": 25_000, "final_episodes": 10, "logdir": None}
# Points of the training curve kept in the JSON line (evenly spaced log records).
CURVE_POINTS = 60
# The flags of this script's smoke run (tests/test_presets.py): a few thousand steps of
# Pendulum-sized learning on HalfCheetah, which checks the pipeline, not the return.
SMOKE_FLAGS = ["--budget=3000", "--eval_every=2000", "--eval_episodes=1", "--min_replay_size=500",
               "--hidden_sizes=32,32", "--updates_per_step=16", "--sample_batch_size=32",
               "--num_actors=1", "--final_episodes=1"]


def own_flags(argv: list[str]) -> tuple[dict, list[str]]:
    """(this script's settings, the flags left for run.py)."""
    settings, rest = dict(DEFAULTS), []
    for arg in argv:
        name, _, value = arg.partition("=")
        key = name[2:]
        if key in ("agent", "env", "logdir"):
            settings[key] = value
        elif key in ("budget", "eval_every", "final_episodes"):
            settings[key] = int(float(value))
        elif key == "target":
            settings[key] = float(value)
        else:
            rest.append(arg)
    return settings, rest


def read_records(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def curves(records: list[dict]) -> tuple[list[list[float]], list[list[float]]]:
    """([env_steps, training return_mean] thinned to CURVE_POINTS, [eval_env_steps,
    eval_return_mean] of every evaluation)."""
    train = [[r["env_steps"], r["return_mean"]] for r in records
             if r.get("return_mean") is not None]
    stride = max(1, len(train) // CURVE_POINTS)
    thinned = train[::stride] + ([train[-1]] if train and (len(train) - 1) % stride else [])
    evals, seen = [], set()
    for r in records:
        if r.get("eval_return_mean") is not None and r.get("eval_env_steps") not in seen:
            seen.add(r.get("eval_env_steps"))
            evals.append([r["eval_env_steps"], r["eval_return_mean"]])
    return thinned, evals


def target_reached(records: list[dict], target: float | None, launched: float,
                   ) -> dict | None:
    """The first evaluation at or above `target`: its env steps and the seconds from launch to
    the record that reported it."""
    if target is None:
        return None
    for r in records:
        if r.get("eval_return_mean") is not None and r["eval_return_mean"] >= target:
            return {"eval_env_steps": r["eval_env_steps"],
                    "wall_s_from_launch": r["time"] - launched}
    return None


def main(argv: list[str]) -> dict:
    s, rest = own_flags(argv)
    with tempfile.TemporaryDirectory() as scratch:
        logdir = s["logdir"] or os.path.join(scratch, "run")
        launched = time.time()
        run_child([sys.executable, os.path.join(REPO, "launch", "run.py"), f"--agent={s['agent']}",
                   f"--env={s['env']}", "--platform=local_mp", "--quiet", f"--logdir={logdir}",
                   f"--total_env_steps={s['budget']}", f"--eval_every={s['eval_every']}",
                   "--stop_at_return=none", *rest], check=True, cwd=REPO,
                  stdout=subprocess.DEVNULL)
        ran_s = time.time() - launched
        with open(os.path.join(logdir, "summary.json")) as f:
            summary = json.load(f)
        with open(os.path.join(logdir, "config.json")) as f:
            preset = json.load(f)["command_line"]["preset"]
        records = read_records(logdir)
        played = run_child([sys.executable, os.path.join(REPO, "launch", "evaluate.py"), logdir,
                            f"--episodes={s['final_episodes']}"], check=True,
                           capture_output=True, cwd=REPO)
        final = json.loads(played.stdout.strip().splitlines()[-1])
    train, evals = curves(records)
    last = records[-1] if records else {}
    return {
        "agent": s["agent"], "env": s["env"], "preset": preset, "budget": s["budget"],
        "env_steps": summary["env_steps"], "wall_time_s": summary["wall_time_s"],
        "launch_to_end_s": ran_s,
        "env_steps_per_s": summary["env_steps_per_s"],
        "sgd_steps": last.get("learner/sgd_steps"),
        "final_deterministic_return": final["return_mean"],
        "final_episodes": final["episodes"],
        "target": s["target"], "target_reached_at": target_reached(records, s["target"],
                                                                   launched),
        "train_curve": train, "eval_curve": evals,
    }


if __name__ == "__main__":
    out = main(sys.argv[1:])
    print(f"{out['agent']} on {out['env']} (preset {out['preset']}): {out['env_steps']:,d} env "
          f"steps in {out['wall_time_s']:.0f} s ({out['launch_to_end_s']:.0f} s from launch), "
          f"{out['env_steps_per_s']:,.0f} env steps/s, {out['sgd_steps']} SGD "
          f"steps; final greedy return {out['final_deterministic_return']:.1f} over "
          f"{out['final_episodes']} episodes")
    for steps, value in out["eval_curve"]:
        print(f"  eval at {steps:>9,d} env steps: {value:9.1f}")
    if out["target"] is not None:
        print(f"  target {out['target']:g}: {out['target_reached_at'] or 'not reached'}")
    print(json.dumps(rounded(out)))
