"""Env steps/s of the acting pipeline, stage by stage, on local_mt and local_mp.

  (a) env:        one env worker stepping its vector env alone, random actions, no RPC
  (b) inference:  env workers + central inference, learning off (unrolls drained)
  (c) impala:     the full IMPALA pipeline (inference + learner)

(b) and (c) run once per transport between env workers and inference: shared memory (shm)
and the RPC socket (socket). Each gives two rates: from the learner node's start (policy and
learner compilation included, as a run of that length sees it) and steady, from the first
learner update (the first env step for (b)) to the end, once every program is compiled (the
policy's smaller batch sizes compile while it serves: the window opens once they have; the
learner's update compiles a larger batch size when the feed first asks for it, which may be
well into the run: the window reopens after each such compile, once a later poll shows the
run going on after it).

Usage: python benchmarks/throughput.py [--env CartPole-v1] [--num_actors 2]
       [--envs_per_actor 32] [--env_steps 300000] [--transports shm,socket]
Prints a table, then one JSON object with every figure as the last line.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

from common import cpu_count, rounded

from trellis.builders.contract.config import ExperimentConfig
from trellis.envs import GymnasiumFactory
from trellis.launch import runtime

# Only light imports at module level, as in launch/run.py: local_mp's spawned node processes
# re-run this module's top level (and scaling.py's, which imports it), and 32 env workers each
# importing JAX on 2 cores took ~20 s from the learner's start of issue 21's scaling check.

# The flags of this script's smoke run in the default test suite (tests/test_benchmarks.py):
# its main path on a budget of seconds.
SMOKE_FLAGS = ["--platforms=local_mt", "--transports=shm", "--num_actors=1",
               "--envs_per_actor=4", "--env_steps=2000", "--env_seconds=0.2"]


def env_only(factory: GymnasiumFactory, num_envs: int, seconds: float, seed: int = 0) -> float:
    """Steps/s of one vector env with random actions (what one env worker can do at best)."""
    envs = factory.make_vector(num_envs, seed=seed)
    envs.action_space.seed(seed)
    envs.reset(seed=seed)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        envs.step(envs.action_space.sample())
        steps += num_envs
    rate = steps / (time.perf_counter() - start)
    envs.close()
    return rate


def pipeline(factory: GymnasiumFactory, platform_name: str, transport: str, args,
             learn: bool) -> dict:
    """Runs the program to the step budget; steps/s measured by the learner node's counter.

    `env_steps_per_s` counts from the learner node's start (after JAX import and program
    start-up, with the policy's and the learner's compilation inside); `steady_env_steps_per_s`
    from the first learner stats that show an update (an env step when not learning), the
    policy compiled for every batch size and the update for every size the run has asked for
    so far, to the end, so it is the rate a long run settles to.
    """
    from trellis.agents.impala import ImpalaBuilder, ImpalaConfig
    from trellis.builders.experiments.program import make_program

    config = ExperimentConfig(
        num_actors=args.num_actors,
        envs_per_actor=args.envs_per_actor,
        total_env_steps=args.env_steps,
        seed=0,
        learn=learn,
        transport=transport,
    )
    builder = ImpalaBuilder(ImpalaConfig())
    program = make_program(builder, factory, config, name="throughput")
    start = time.perf_counter()
    running = runtime.launch(program, platform=platform_name, block=False)
    warm = _steady_start(running, program.handles("learner")[0].dereference(),
                         "learner_steps" if learn else "env_steps")
    result = running.wait()
    wall = time.perf_counter() - start
    if result.stopped_by != "requested":
        raise RuntimeError(f"{platform_name}: run ended by {result.stopped_by}: {result.reason}")
    info = result.info
    steady = {name: (info[name] - warm[name]) / (info["elapsed_s"] - warm["elapsed_s"])
              for name in ("env_steps", "learner_steps")} if warm else {}
    return {
        "env_steps_per_s": info["env_steps"] / info["elapsed_s"],
        "learner_steps_per_s": info["learner_steps"] / info["elapsed_s"],
        "steady_env_steps_per_s": steady.get("env_steps"),
        "steady_learner_steps_per_s": steady.get("learner_steps"),
        "steady_s": info["elapsed_s"] - warm["elapsed_s"] if warm else None,
        "wall_s": wall,
    }


def _steady_start(running, learner, count: str, period_s: float = 0.1) -> dict | None:
    """The learner's stats where the steady window opens, polled every `period_s` while the
    program runs: the first with `count` > 0 and the policy compiled for every batch size,
    or, where the learner's update is compiled for a larger batch size after that (the feed
    asks for it once unrolls wait), the first after its last such compile; either only once
    a later poll shows `count` going on from it, so a window is never empty (a run that ends
    right after a compile keeps the window before it); None if the program stopped before a
    window opened."""
    start = candidate = None
    while running.wait(timeout=period_s) is None:
        try:
            stats = learner.stats()
        except (ConnectionError, EOFError):  # The learner node stopped meanwhile.
            break
        if candidate is None:
            if stats[count] > 0 and stats["startup"]["policy_compiled"] is not None:
                candidate = stats
        elif stats["startup"]["learner_compiled"] != candidate["startup"]["learner_compiled"]:
            candidate = stats
        elif stats[count] > candidate[count]:
            start = candidate
    return start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--num_actors", type=int, default=2)
    p.add_argument("--envs_per_actor", type=int, default=32)
    p.add_argument("--env_steps", type=int, default=300_000)
    p.add_argument("--env_seconds", type=float, default=3.0)
    p.add_argument("--platforms", default="local_mt,local_mp")
    p.add_argument("--transports", default="shm,socket")
    args = p.parse_args()
    runs = [(platform_name, transport) for platform_name in args.platforms.split(",")
            for transport in args.transports.split(",")]

    factory = GymnasiumFactory(args.env)
    results: dict = {
        "env": args.env,
        "num_actors": args.num_actors,
        "envs_per_actor": args.envs_per_actor,
        "machine": f"{platform.machine()}, {cpu_count()} cores",
        "env_only_steps_per_s": env_only(factory, args.envs_per_actor, args.env_seconds),
    }
    for name, transport in runs:
        for stage, learn in (("inference", False), ("impala", True)):
            print(f"running {stage} on {name} over {transport} ...", flush=True)
            results[f"{name}/{transport}/{stage}"] = pipeline(factory, name, transport, args,
                                                              learn)

    print()
    print(f"{args.env}, {args.num_actors} env workers x {args.envs_per_actor} envs")
    print(f"{'':<36}{'from the learner start':>32}{'steady':>32}")
    print(f"{'stage':<36}" + f"{'env steps/s':>14}{'learner steps/s':>18}" * 2)
    print(f"{'(a) env alone, 1 worker':<36}{results['env_only_steps_per_s']:>14,.0f}{'-':>18}")
    for name, transport in runs:
        for stage, label in (("inference", "(b) + inference"), ("impala", "(c) full IMPALA")):
            r = results[f"{name}/{transport}/{stage}"]
            row = f"{label}, {name}, {transport}"
            print(f"{row:<36}{_rates(r['env_steps_per_s'], r['learner_steps_per_s'])}"
                  f"{_rates(r['steady_env_steps_per_s'], r['steady_learner_steps_per_s'])}")
    print(json.dumps(rounded(results)))


def _rates(env_steps_per_s: float | None, learner_steps_per_s: float | None) -> str:
    if env_steps_per_s is None:  # The run ended before its first update, or before the
        # policy compiled for every batch size (a short run on a loaded machine).
        return f"{'-':>14}{'-':>18}"
    return f"{env_steps_per_s:>14,.0f}{learner_steps_per_s:>18,.1f}"


if __name__ == "__main__":
    main()
