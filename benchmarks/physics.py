"""PPO on physics written in JAX against the simulator alone, in one process, on one device.

Usage: python benchmarks/physics.py [--env=brax:inverted_pendulum] [--calls=5] [run.py flags]

Builds the anakin program exactly as `launch/run.py --platform=anakin` does (same flags: the
agent's settings, `--updates_per_call`, ...), and times:
  raw: the env alone, the same number of envs (the agent's batch_size) stepped with uniform
       random actions for one call's env steps, as one jitted `lax.scan` of `vmap(env.step)`
       (the same `JaxEnv` wrapper, autoreset included, that the learning loop steps);
  learn: the compiled act-and-learn call (`updates_per_call` updates, each an unroll of every
       env and the agent's update on it);
alternately, `--calls` times each after a first call (compilation), median per call. The ratio
learn / raw is the share of the simulator's own rate the learning loop keeps (the physics
issue asks for >= 0.7); each first call less a timed one (and the population's build, for
learn) is about its compile time. Both run under `use_cpu_cores` as run.py's anakin does.
Prints a line per measure, then one JSON line.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

# The defaults of this script: Brax's inverted pendulum with PPO's published continuous-control
# settings scaled to a 2-core machine (docs/benchmarks.md, "Physics on the device").
DEFAULTS = ["--env=brax:inverted_pendulum", "--agent=ppo", "--batch_size=256",
            "--unroll_length=32", "--num_minibatches=4", "--num_epochs=4",
            "--updates_per_call=4"]
# The flags of this script's smoke run in the default test suite (tests/test_benchmarks.py).
SMOKE_FLAGS = ["--calls=1", "--env=gymnax:Pendulum-v1", "--batch_size=16", "--unroll_length=8",
               "--updates_per_call=1"]


def own_flags(argv: list[str]) -> tuple[int, list[str]]:
    """(--calls, the rest: run.py's flags after this script's defaults)."""
    calls, rest = 5, []
    for arg in argv:
        if arg.startswith("--calls="):
            calls = int(arg.split("=", 1)[1])
        else:
            rest.append(arg)
    return calls, [*DEFAULTS, *rest, "--platform=anakin"]


def timed(fns: list, calls: int) -> tuple[list[float], list[float]]:
    """(median seconds per call of each of `fns` over `calls` rounds, seconds of each one's
    first call): the first call compiles and is not in the median; a round calls each once,
    alternating, so a shared machine's changing load weighs on all alike."""
    first = []
    for fn in fns:
        start = time.perf_counter()
        fn()
        first.append(time.perf_counter() - start)
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(calls):
        for fn, spent in zip(fns, times, strict=True):
            start = time.perf_counter()
            fn()
            spent.append(time.perf_counter() - start)
    return [statistics.median(spent) for spent in times], first


def main(argv: list[str]) -> dict:
    from trellis.builders.experiments.anakin_run import use_cpu_cores

    calls, flags = own_flags(argv)
    with use_cpu_cores():
        import jax
        import jax.numpy as jnp

        from trellis.builders.experiments.anakin_run import make_population
        from trellis.launch import flags as flag_parser

        settings = flag_parser.parse(flags, prog="physics.py")
        builder, env_factory = settings.build()
        start = time.perf_counter()  # Building the population compiles its program.
        population = make_population(builder, env_factory, settings.experiment.seed,
                                     settings.experiment.return_window, settings.platform(),
                                     settings.experiment.total_env_steps)
        build_s = time.perf_counter() - start
        steps_per_call = population.env_steps_per_call
        spec, env = env_factory.spec(), env_factory.make()
        num_envs = population.anakin.num_envs
        num_steps = steps_per_call // num_envs
        low, high = jnp.asarray(spec.action_low), jnp.asarray(spec.action_high)

        @jax.jit
        def raw(key):
            reset_key, key = jax.random.split(key)
            state, _ = jax.vmap(env.reset)(jax.random.split(reset_key, num_envs))

            def body(state, key):
                action_key, step_key = jax.random.split(key)
                actions = jax.random.uniform(action_key, (num_envs,) + spec.action_shape,
                                             minval=low, maxval=high)
                state, timestep = jax.vmap(env.step)(jax.random.split(step_key, num_envs),
                                                     state, actions)
                return state, jnp.sum(timestep.reward)

            return jax.lax.scan(body, state, jax.random.split(key, num_steps))[1]

        key = jax.random.key(0)
        (raw_s, learn_s), (raw_first_s, learn_first_s) = timed(
            [lambda: jax.block_until_ready(raw(key)),
             lambda: jax.block_until_ready(population.step()[0])], calls)
    result = {
        "env": env_factory.env_id, "agent": settings.options.agent, "num_envs": num_envs,
        "env_steps_per_call": steps_per_call, "device": str(jax.devices()[0].platform),
        "raw_env_steps_per_s": round(steps_per_call / raw_s, 1),
        "learn_env_steps_per_s": round(steps_per_call / learn_s, 1),
        # A first call less a timed one: about the compile (issue 47: a humanoid's under 60 s).
        "raw_compile_s": round(raw_first_s - raw_s, 1),
        "learn_compile_s": round(build_s + learn_first_s - learn_s, 1),
    }
    result["ratio"] = round(result["learn_env_steps_per_s"] / result["raw_env_steps_per_s"], 3)
    return result


if __name__ == "__main__":
    out = main(sys.argv[1:])
    print(f"{out['env']}: {out['num_envs']} envs, {out['env_steps_per_call']:,d} env steps "
          f"per call on {out['device']}")
    print(f"  simulator alone   {out['raw_env_steps_per_s']:>12,.0f} env steps/s")
    print(f"  {out['agent']} learning   {out['learn_env_steps_per_s']:>12,.0f} env steps/s "
          f"({out['ratio']:.2f} of the simulator's)")
    print(f"  compile (a first call less a timed one, and the build): simulator "
          f"{out['raw_compile_s']:.1f} s, {out['agent']} {out['learn_compile_s']:.1f} s")
    print(json.dumps(out))
