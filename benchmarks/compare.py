"""Trellis on local_mp against Stable-Baselines3 on the same machine: env steps/s and time to
a mean return of 450, start-up included.

Usage: python benchmarks/compare.py [--task cartpole|memory] [--seeds 1,2,3]
           [--sb3_seeds 1,2,3] [--target 450] [--sb3_venv DIR] [--no_sb3]

--task=cartpole (default): `launch/run.py --agent=impala --platform=local_mp
--stop_at_return=TARGET` (run.py's defaults otherwise) against SB3's A2C with the RL Baselines3
Zoo's settings for CartPole-v1 (8 envs in a DummyVecEnv, MlpPolicy, ent_coef 0, SB3's defaults
otherwise; at most the zoo's 500k steps).

--task=memory (issue 11): CartPole-v1 without the velocities. Ours are the issue's two
commands, `launch/run.py --agent=impala --core=lstm --env=CartPoleNoVel-v1 --platform=local_mp
--stop_at_return=TARGET` and `launch/run.py --agent=r2d2 --env=CartPoleNoVel-v1
--platform=local_mp --stop_at_return=TARGET`; theirs is SB3-contrib's RecurrentPPO with the
zoo's `ppo_lstm` settings for CartPoleNoVel-v1 (hyperparams/ppo_lstm.yml in
github.com/DLR-RM/rl-baselines3-zoo, as published with the sb3/ppo_lstm-CartPoleNoVel-v1 model:
8 envs, VecNormalize on observations only, MlpLstmPolicy with a 64-unit LSTM for the actor and
one for the critic, pi/vf [64], no orthogonal init, n_steps 32, batch 256, 20 epochs,
gamma 0.98, GAE lambda 0.8, learning rate and clip range linear from 1e-3 and 0.2 to 0 over
the zoo's 1e5 steps, ent_coef 0), on CartPole-v1 with the velocities taken out of the
observation here (trellis is not installed in SB3's environment), as CartPoleNoVel-v1 does.
One zoo setting is left out: its ReLU activation (SB3's default is tanh). Naming it takes
PyTorch's `nn` module, and no file of this project imports PyTorch; the activation does not
change the rate at which RecurrentPPO steps, which bounds its wall time here.

Each run is a child of this process, one after the other, stopped when the mean return of its
last 100 episodes reaches TARGET (the window Trellis' stop rule uses), or at SB3's step budget
(then its time is a lower bound on its time to TARGET). Each side's time is measured here,
from starting its process to its exit, so interpreter start, imports and compilation count;
env steps/s is its env steps over that time. Trellis' own wall time (from its summary.json)
is printed beside it.

SB3 and PyTorch are never dependencies of Trellis: they go into a throw-away virtual
environment that this script creates and deletes (or DIR, created once and kept, to rerun).
--no_sb3 runs ours alone (no network, no PyTorch; no ratios): the smoke run of the test suite.
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

from common import rounded, run_child

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The flags of this script's smoke run in the default test suite (tests/test_benchmarks.py):
# its main path on a budget of seconds.
SMOKE_FLAGS = ["--no_sb3", "--seeds=1", "--target=15"]
SB3_PACKAGES = ["stable-baselines3>=2.3", "sb3-contrib>=2.3"]

# The part both SB3 scripts share: the target and seed from argv, training stopped once the
# mean return of the last 100 episodes (SB3's ep_info_buffer) reaches the target or at the step
# budget, and one JSON line with the outcome.
STOP_AND_REPORT = """
import json, sys
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

target, seed = float(sys.argv[1]), int(sys.argv[2])

def reached(episodes):
    return (len(episodes) == episodes.maxlen
            and sum(e["r"] for e in episodes) / len(episodes) >= target)

class StopAtMeanReturn(BaseCallback):
    def _on_step(self):
        return not reached(self.model.ep_info_buffer)

def learn_and_report(model, budget):
    model.learn(total_timesteps=budget, callback=StopAtMeanReturn())
    episodes = model.ep_info_buffer
    mean = sum(e["r"] for e in episodes) / max(len(episodes), 1)
    print(json.dumps({"env_steps": int(model.num_timesteps), "mean_return": mean,
                      "reached": reached(episodes)}))
"""

# Runs in the SB3 environment: A2C with the zoo's CartPole-v1 settings.
A2C_SCRIPT = """
from stable_baselines3 import A2C
""" + STOP_AND_REPORT + """
model = A2C("MlpPolicy", make_vec_env("CartPole-v1", n_envs=8, seed=seed), ent_coef=0.0,
            seed=seed, device="cpu")
learn_and_report(model, 500_000)
"""

# Runs in the SB3 environment: RecurrentPPO with the zoo's ppo_lstm settings for
# CartPoleNoVel-v1 (see the module docstring), on CartPole-v1 observed as (x, theta).
RECURRENT_PPO_SCRIPT = """
import gymnasium as gym
import numpy as np
from sb3_contrib import RecurrentPPO
from stable_baselines3.common.vec_env import VecNormalize
""" + STOP_AND_REPORT + """
class NoVelocity(gym.ObservationWrapper):
    # (x, x_dot, theta, theta_dot) -> (x, theta): the observation of CartPoleNoVel-v1.
    def __init__(self, env):
        super().__init__(env)
        low, high = env.observation_space.low, env.observation_space.high
        self.observation_space = gym.spaces.Box(low[[0, 2]], high[[0, 2]], dtype=np.float32)

    def observation(self, obs):
        return obs[[0, 2]]

def linear(start):
    return lambda progress_remaining: progress_remaining * start

envs = VecNormalize(make_vec_env("CartPole-v1", n_envs=8, seed=seed, wrapper_class=NoVelocity),
                    norm_obs=True, norm_reward=False)
model = RecurrentPPO(
    "MlpLstmPolicy", envs, n_steps=32, batch_size=256, n_epochs=20, gamma=0.98,
    gae_lambda=0.8, learning_rate=linear(1e-3), clip_range=linear(0.2), ent_coef=0.0,
    policy_kwargs=dict(ortho_init=False, lstm_hidden_size=64,
                       enable_critic_lstm=True, net_arch=dict(pi=[64], vf=[64])),
    seed=seed, device="cpu")
learn_and_report(model, 100_000)
"""


def timed(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    start = time.monotonic()
    out = run_child(cmd, cwd=REPO, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{cmd[:3]} exited with {out.returncode}:\n{out.stderr[-3000:]}")
    return time.monotonic() - start, out


NOVEL = "--env=CartPoleNoVel-v1"
# Per task: our runs (name -> run.py flags besides platform, seed and return target), then
# SB3's (name -> the script run in its environment).
TASKS = {
    "cartpole": ({"impala_local_mp": ["--agent=impala"]}, {"sb3_a2c": A2C_SCRIPT}),
    "memory": ({"impala_lstm_local_mp": ["--agent=impala", "--core=lstm", NOVEL],
                "r2d2_local_mp": ["--agent=r2d2", NOVEL]},
               {"sb3_recurrent_ppo": RECURRENT_PPO_SCRIPT}),
}


def trellis_run(flags: list[str], seed: int, target: float) -> dict:
    """One `launch/run.py` run on local_mp; its wall time here and from its summary.json."""
    with tempfile.TemporaryDirectory() as logdir:
        wall_s, _ = timed([sys.executable, os.path.join(REPO, "launch", "run.py"), *flags,
                           "--platform=local_mp", f"--stop_at_return={target:g}",
                           f"--seed={seed}", f"--logdir={logdir}/run", "--quiet"])
        with open(os.path.join(logdir, "run", "summary.json")) as f:
            s = json.load(f)
    return {"wall_s": wall_s, "run_wall_s": s["wall_time_s"], "env_steps": s["env_steps"],
            "mean_return": s["mean_return"], "reached": s["stopped_by"] == "return_target"}


def sb3_run(python: str, script: str, seed: int, target: float) -> dict:
    wall_s, out = timed([python, "-c", script, str(target), str(seed)])
    return {"wall_s": wall_s, **json.loads(out.stdout.strip().splitlines()[-1])}


def make_sb3_venv(directory: str) -> str:
    """A virtual environment with SB3 (and PyTorch) in `directory`; returns its python."""
    python = os.path.join(directory, "bin", "python")
    if not os.path.exists(python):
        subprocess.run([sys.executable, "-m", "venv", directory], check=True)
    # Also into a kept environment made before a package was added (a no-op once there).
    subprocess.run([python, "-m", "pip", "install", "-q", *SB3_PACKAGES], check=True)
    return python


def summarize(runs: list[dict]) -> dict:
    """Medians over seeds: wall time to the target (start-up included) and env steps/s."""
    return {"runs": runs, "reached": f"{sum(r['reached'] for r in runs)}/{len(runs)}",
            "median_wall_s": statistics.median(r["wall_s"] for r in runs),
            "median_env_steps_per_s": statistics.median(r["env_steps"] / r["wall_s"]
                                                        for r in runs)}


def seed_list(text: str) -> list[int]:
    try:
        return [int(seed) for seed in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"seeds must be integers separated by commas, got {text!r}") from None


def print_run(name: str, seed: int, r: dict) -> None:
    run_wall = f"{r['run_wall_s']:.1f}" if "run_wall_s" in r else "-"
    print(f"{name:<22}{seed:>5}{str(r['reached']):>9}{r['wall_s']:>9.1f}{run_wall:>10}"
          f"{r['env_steps']:>11,d}{r['env_steps'] / r['wall_s']:>10,.0f}"
          f"{r['mean_return']:>9.1f}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="cartpole", choices=sorted(TASKS))
    p.add_argument("--seeds", type=seed_list, default=[1, 2, 3], help="seeds of our runs")
    p.add_argument("--sb3_seeds", type=seed_list, default=None,
                   help="seeds of SB3's runs (default: --seeds)")
    p.add_argument("--target", type=float, default=450.0)
    p.add_argument("--sb3_venv", default=None,
                   help="keep SB3's environment here (created if missing) instead of a "
                        "temporary one")
    p.add_argument("--no_sb3", action="store_true",
                   help="only our runs: no SB3 environment, no ratios")
    args = p.parse_args()
    seeds, sb3_seeds = args.seeds, args.sb3_seeds or args.seeds
    ours, theirs = TASKS[args.task]
    theirs = {} if args.no_sb3 else theirs
    venv = None if args.no_sb3 else args.sb3_venv or tempfile.mkdtemp(prefix="trellis-sb3-")
    results: dict = {"task": args.task, "target": args.target, "seeds": seeds,
                     "sb3_seeds": sb3_seeds}
    try:
        python = make_sb3_venv(venv) if theirs else None
        print(f"{'':<22}{'seed':>5}{'reached':>9}{'wall s':>9}{'run s':>10}{'env steps':>11}"
              f"{'steps/s':>10}{'return':>9}", flush=True)
        runs = [(name, seeds, lambda s, f=flags: trellis_run(f, s, args.target))
                for name, flags in ours.items()]
        runs += [(name, sb3_seeds, lambda s, c=script: sb3_run(python, c, s, args.target))
                 for name, script in theirs.items()]
        for name, run_seeds, run in runs:
            done = []
            for seed in run_seeds:
                done.append(run(seed))
                print_run(name, seed, done[-1])
            results[name] = summarize(done)
    finally:
        if venv is not None and args.sb3_venv is None:
            shutil.rmtree(venv, ignore_errors=True)
    if not theirs:
        print(json.dumps(rounded(results)))
        return
    (reference,) = theirs
    ref = results[reference]
    results["ratios"] = {name: {
        "env_steps_per_s": results[name]["median_env_steps_per_s"]
        / ref["median_env_steps_per_s"],
        "time_to_target": ref["median_wall_s"] / results[name]["median_wall_s"]}
        for name in ours}
    for name in ours:
        r, ratio = results[name], results["ratios"][name]
        print(f"{name}: median {r['median_env_steps_per_s']:,.0f} env steps/s "
              f"(x{ratio['env_steps_per_s']:.1f} {reference}'s "
              f"{ref['median_env_steps_per_s']:,.0f}); median time to {args.target:g} "
              f"{r['median_wall_s']:.1f} s ({r['reached']} reached) against "
              f"{ref['median_wall_s']:.1f} s ({ref['reached']} reached): "
              f"x{ratio['time_to_target']:.1f} faster")
    print(json.dumps(rounded(results)))


if __name__ == "__main__":
    main()
