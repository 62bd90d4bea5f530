"""IPPO (and MAPPO) on MPE simple_spread (N=3): return against env steps and wall time.

Usage: python benchmarks/multi_agent.py [--agents ippo,mappo] [--seeds 0]
       [--total_env_steps 10000000] [--random_episodes 1000]

Every figure comes from `launch/run.py` started as a user starts it (process start, imports
and compilation included), read back from its run directory:
  - the team's mean return (the sum over agents of their episode rewards, mean of the last 100
    episodes) against env steps and wall time (metrics.jsonl), and at the end;
  - env steps/s: anakin's steady rate (after the first compiled call, summary.json), the host's
    over the whole session;
  - the floor: a uniformly random policy's mean return over --random_episodes episodes;
  - the reference: JaxMARL's published IPPO settings for MPE (`REFERENCE`), which are
    Trellis's IPPO defaults, and the result of JaxMARL's own IPPO with them.
Platforms (`--platforms`): anakin (`--env=jaxmarl:MPE_simple_spread_v3`, JaxMARL's env stepped
in the jitted program) and local_mp (`--env=pettingzoo:mpe2/simple_spread_v3`, mpe2's env
through PettingZoo in 2 env-worker processes of 8 envs, with mpe2's random floor).
Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from common import cpu_count, rounded, run_child

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The flags of this script's smoke run in the default test suite (tests/test_benchmarks.py).
SMOKE_FLAGS = ["--agents=ippo", "--total_env_steps=20000", "--updates_per_call=4",
               "--random_episodes=20"]

# JaxMARL's IPPO on MPE simple_spread: baselines/IPPO/config/ippo_ff_mpe.yaml (FLAIROx/JaxMARL
# at c793d09; the paper, Rutherford et al. 2024, arXiv:2311.10090, plots it without a table).
# Its return: JaxMARL's own baselines/IPPO/ippo_ff_mpe.py run with that config (seed 30, one
# seed; hydra and wandb stubbed out) on the 2-core CPU machine, mean of its last 10 updates'
# logged returns (MPELogWrapper: each agent's reward times N, averaged over agents: the
# team's sum, as here).
REFERENCE = {
    "source": "FLAIROx/JaxMARL c793d09 baselines/IPPO/config/ippo_ff_mpe.yaml",
    "settings": {"num_envs": 16, "num_steps": 128, "total_timesteps": 10_000_000,
                 "update_epochs": 4, "num_minibatches": 4, "lr": 2.5e-4, "anneal_lr": True,
                 "gamma": 0.99, "gae_lambda": 0.95, "clip_eps": 0.2, "ent_coef": 0.01,
                 "vf_coef": 0.5, "max_grad_norm": 0.5, "activation": "tanh",
                 "hidden": [64, 64]},
    "return_at_1e7_env_steps": -58.9,
}
ENV = "jaxmarl:MPE_simple_spread_v3"


def random_return(episodes: int) -> float:
    """A uniformly random policy's mean team return on simple_spread (JAX, in this process)."""
    import jax
    import numpy as np

    from trellis.builders.experiments.device_evaluation import play_episodes
    from trellis.envs import make_env_factory
    from trellis.envs.jax_multi_agent import TeamEnv, random_policy

    factory = make_env_factory(ENV)
    env, policy = TeamEnv(factory.make()), random_policy(factory.spec())
    returns = jax.jit(lambda key: play_episodes(env, policy, None, {}, episodes, key))(
        jax.random.key(0))
    return float(np.mean(returns))


def _run(agent: str, seed: int, args: argparse.Namespace, runs: str, platform: str, env: str,
         flags: list[str]) -> dict:
    """One run.py process: its curve (env steps, wall time, return), result and speed."""
    logdir = tempfile.mkdtemp(dir=runs)
    cmd = [sys.executable, os.path.join(REPO, "launch", "run.py"), f"--agent={agent}",
           f"--platform={platform}", f"--env={env}", "--quiet", f"--seed={seed}",
           f"--total_env_steps={args.total_env_steps}", "--log_every_s=10",
           f"--logdir={logdir}", *flags]
    run_child(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    with open(os.path.join(logdir, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(logdir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    curve = [[r["env_steps"], r["wall_time_s"], r["return_mean"]] for r in records
             if r.get("return_mean") is not None]
    # Anakin's rate after its first compiled call; the host's over the whole session.
    rate = summary.get("steady_env_steps_per_s", summary["env_steps_per_s"])
    return {"agent": agent, "platform": platform, "seed": seed,
            "env_steps": summary["env_steps"], "wall_time_s": summary["wall_time_s"],
            "final_return": summary["mean_return"], "steady_env_steps_per_s": rate,
            "curve": curve}


def anakin(agent: str, seed: int, args: argparse.Namespace, runs: str) -> dict:
    """JaxMARL's simple_spread stepped inside the jitted program."""
    return _run(agent, seed, args, runs, "anakin", ENV,
                [f"--updates_per_call={args.updates_per_call}"])


# The host platforms: mpe2's simple_spread through PettingZoo (the same MPE scenario; its
# random floor is `host_random_return`), 2 env workers of 8 envs (IPPO's 16 envs per update).
HOST_ENV = "pettingzoo:mpe2/simple_spread_v3"


def local_mp(agent: str, seed: int, args: argparse.Namespace, runs: str) -> dict:
    """Env workers and the learner node in processes of their own; steps/s over the session
    (start-up included)."""
    return _run(agent, seed, args, runs, "local_mp", HOST_ENV,
                ["--num_actors=2", "--envs_per_actor=8"])


def host_random_return(episodes: int) -> float:
    """A uniformly random policy's mean team return on mpe2's simple_spread (numpy)."""
    import numpy as np

    from trellis.envs import make_env_factory
    from trellis.envs.multi_agent import episode_done

    factory = make_env_factory(HOST_ENV)
    spec, rng = factory.spec(), np.random.default_rng(0)
    envs = factory.make_vector(episodes, seed=0)
    total, running = np.zeros(episodes), np.ones(episodes, bool)
    while running.any():
        step = envs.step({a: rng.integers(0, spec.specs[a].num_actions, episodes)
                          for a in spec.agents})
        total += running * sum(step.reward[a] for a in spec.agents)
        running &= ~np.asarray(episode_done(step, spec.agents))
    envs.close()
    return float(np.mean(total))


# How each platform runs the agent: (agent, seed, the flags, runs dir) -> result.
PLATFORMS = {"anakin": anakin, "local_mp": local_mp}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", default="ippo,mappo")
    p.add_argument("--platforms", default="anakin", help=f"of {', '.join(PLATFORMS)}")
    p.add_argument("--seeds", default="0")
    p.add_argument("--total_env_steps", type=int, default=REFERENCE["settings"][
        "total_timesteps"])
    p.add_argument("--updates_per_call", type=int, default=32, help="anakin's")
    p.add_argument("--random_episodes", type=int, default=1000)
    args = p.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as runs:
        for platform in args.platforms.split(","):
            for agent in args.agents.split(","):
                for seed in (int(s) for s in args.seeds.split(",")):
                    results.append(PLATFORMS[platform](agent, seed, args, runs))
    floor = random_return(args.random_episodes)
    platforms = args.platforms.split(",")
    host_floor = host_random_return(args.random_episodes) if "local_mp" in platforms else None
    print(f"MPE simple_spread (N=3), {cpu_count()} cores; random policy {floor:.1f} (JaxMARL's)"
          + ("" if host_floor is None else f", {host_floor:.1f} (mpe2's)")
          + f"; JaxMARL's IPPO {REFERENCE['return_at_1e7_env_steps']} at 1e7 env steps")
    print(f"{'agent':6} {'platform':9} {'seed':>4} {'env steps':>11} {'wall s':>8} "
          f"{'return':>8} {'steps/s':>9}")
    for r in results:
        print(f"{r['agent']:6} {r['platform']:9} {r['seed']:4d} {r['env_steps']:11,d} "
              f"{r['wall_time_s']:8.1f} {r['final_return']:8.1f} "
              f"{r['steady_env_steps_per_s']:9,.0f}")
    print(json.dumps({**rounded({"env": ENV, "cores": cpu_count(), "random_return": floor,
                                 "host_env": HOST_ENV, "host_random_return": host_floor,
                                 "results": results}), "reference": REFERENCE}))


if __name__ == "__main__":
    main()
