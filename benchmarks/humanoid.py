"""The Humanoid race: wall time from launch to a return, compile included, on physics in JAX.

Usage: python benchmarks/humanoid.py [--race=pendulum|brax_humanoid|playground_humanoid]
       [--target=R] [--budget=ENV_STEPS] [run.py flags]

The RLlib paper's large-scale figure is the time ES and PPO take to reach a return of 6000 on
MuJoCo's Humanoid-v1 with hundreds of CPU cores (Liang et al., 2018, "RLlib: Abstractions for
Distributed Reinforcement Learning", Figure 6). Here the same race runs on one device with the
physics in JAX: `launch/run.py --platform=anakin` is started as a user starts it, with the
race's env and PPO settings, stopped at the target return (or the env-step budget), and its
summary.json gives the wall time from the process's start, the env steps and the steady env
steps/s; the simulator's own rate on the same device (benchmarks/physics.py's raw measure, same
envs) is printed beside it. Races:
  pendulum: brax:inverted_pendulum to 900 (of 1,000), the 2-core stand-in;
  brax_humanoid: brax:humanoid to 6,000 (the RLlib paper's figure), with the PPO settings of
    the physics issue's measured command (2,048 envs, unroll 10, 32 minibatches, 8 epochs,
    Adam 3e-4, entropy 1e-3, discount 0.97, 256 x 256), plus Brax's training notebook's
    reward scaling 0.1 and normalised observations (recalled, not re-read: no network here);
  playground_humanoid: playground:HumanoidWalk with Playground's published DM Control Suite
    PPO settings (mujoco_playground/config/dm_control_suite_params.py: 2,048 envs, unroll 30,
    32 minibatches, 16 epochs, Adam 1e-3, entropy 1e-2, discount 0.995, reward scaling 10,
    normalised observations); Playground reports its results as curves, so no target is
    assumed: give --target.
Extra flags go to run.py (and override the race's). Prints a table, then one JSON line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import physics
from common import run_child

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RACES = {
    # benchmarks/physics.py's settings, so the simulator's rate is measured on the same envs.
    "pendulum": {"env": "brax:inverted_pendulum", "target": 900.0, "budget": 3_000_000,
                 "flags": [f for f in physics.DEFAULTS if not f.startswith(("--env", "--agent"))]},
    "brax_humanoid": {"env": "brax:humanoid", "target": 6000.0, "budget": 100_000_000,
                      "flags": ["--batch_size=2048", "--unroll_length=10",
                                "--num_minibatches=32", "--num_epochs=8",
                                "--learning_rate=3e-4", "--entropy_cost=1e-3",
                                "--discount=0.97", "--reward_scale=0.1",
                                "--normalize_observations=true", "--hidden_sizes=256,256",
                                "--updates_per_call=1"]},
    "playground_humanoid": {"env": "playground:HumanoidWalk", "target": None,
                            "budget": 60_000_000,
                            "flags": ["--batch_size=2048", "--unroll_length=30",
                                      "--num_minibatches=32", "--num_epochs=16",
                                      "--learning_rate=1e-3", "--entropy_cost=1e-2",
                                      "--discount=0.995", "--reward_scale=10",
                                      "--normalize_observations=true",
                                      "--hidden_sizes=256,256", "--updates_per_call=1"]},
}
# The flags of this script's smoke run in the default test suite (tests/test_benchmarks.py).
SMOKE_FLAGS = ["--env=gymnax:Pendulum-v1", "--target=0", "--budget=2048", "--batch_size=16",
               "--unroll_length=8", "--updates_per_call=1"]


def own_flags(argv: list[str]) -> tuple[dict, list[str]]:
    """(the race with --race/--target/--budget applied, the flags left for run.py)."""
    race, rest, overrides = "pendulum", [], {}
    for arg in argv:
        name, _, value = arg.partition("=")
        if name == "--race":
            if value not in RACES:
                sys.exit(f"humanoid.py: --race must be one of {', '.join(RACES)}, got {value!r}")
            race = value
        elif name in ("--target", "--budget"):
            overrides[name[2:]] = float(value) if name == "--target" else int(float(value))
        else:
            rest.append(arg)
    settings = {**RACES[race], "race": race, **overrides}
    if settings["target"] is None:
        sys.exit(f"humanoid.py: --race={race} has no published target to assume; give --target")
    return settings, rest


def main(argv: list[str]) -> dict:
    race, rest = own_flags(argv)
    flags = [f"--env={race['env']}", *race["flags"], *rest]
    with tempfile.TemporaryDirectory() as logdir:
        run_child([sys.executable, os.path.join(REPO, "launch", "run.py"), "--agent=ppo",
                   "--platform=anakin", "--quiet", f"--logdir={logdir}",
                   f"--stop_at_return={race['target']}",
                   f"--total_env_steps={race['budget']}", *flags], check=True, cwd=REPO,
                  stdout=subprocess.DEVNULL)
        with open(os.path.join(logdir, "summary.json")) as f:
            summary = json.load(f)
    simulator = physics.main(["--calls=3", *flags])
    return {
        "race": race["race"], "env": summary["env"], "target": race["target"],
        "reached": summary["stopped_by"] == "return_target",
        "wall_time_s": summary["wall_time_s"], "env_steps": summary["env_steps"],
        "mean_return": summary["mean_return"],
        "steady_env_steps_per_s": summary["steady_env_steps_per_s"],
        "simulator_env_steps_per_s": simulator["raw_env_steps_per_s"],
        "device": simulator["device"],
    }


if __name__ == "__main__":
    out = main(sys.argv[1:])
    verdict = "reached" if out["reached"] else "did not reach"
    mean = "-" if out["mean_return"] is None else f"{out['mean_return']:.1f}"
    print(f"{out['race']}: {out['env']} on {out['device']} {verdict} {out['target']:g} in "
          f"{out['wall_time_s']:.1f} s from launch ({out['env_steps']:,d} env steps, mean return "
          f"{mean})")
    print(f"  learning {out['steady_env_steps_per_s']:,.0f} env steps/s, the simulator alone "
          f"{out['simulator_env_steps_per_s']:,.0f}")
    print(json.dumps(out))
