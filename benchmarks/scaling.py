"""Env steps/s of the IMPALA pipeline as env workers go from 1 to the number of cores.

The shape of the RLlib paper's "policy evaluation throughput vs cores" figure: for each
platform and each worker count, the full IMPALA pipeline (env workers, central inference,
learner) runs to the env-step budget, and its rate is measured by the learner node as in
benchmarks/throughput.py (counted from the learner's start, so start-up is left out). As run.py
does, the programs use JAX's persistent compilation cache in runs/.jax_cache, and each point's
runs come after a warm-up run of one env step per env that puts its programs there (compiling
them is start-up too: on 2 cores it took the 32-worker run's first seconds); with
--no_compile_cache every run compiles its programs, and there is no warm-up.

Usage: python benchmarks/scaling.py [--platforms local_mp,ray] [--max_workers N]
       [--workers 1,8,32] [--sleep_ms MS] [--envs_per_actor 32] [--env_steps 200000]
       [--transport shm] [--repeats 1] [--no_compile_cache] [--out scaling.png]
Workers go 1..N, N = the cores this process may use unless --max_workers is given, or
through the counts --workers lists. --sleep_ms=MS runs the env `sleep:MS` (envs/sleep_env.py:
each step sleeps MS ms and uses no CPU), whose ideal rate is workers x envs_per_actor / MS
env steps per ms: central inference's scaling to more workers than cores, with learning on.
Writes the plot to --out, prints a table, then one JSON object with every figure as the
last line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics

from common import cpu_count, rounded
from throughput import pipeline

from trellis.envs import make_env_factory

# The flags of this script's smoke run in the default test suite (tests/test_benchmarks.py):
# its main path on a budget of seconds.
SMOKE_FLAGS = ["--platforms=local_mt", "--max_workers=1", "--envs_per_actor=4",
               "--env_steps=2000", "--out=scaling.png"]


def measure(factory, platform_name: str, num_actors: int, args, warm_up: bool) -> dict:
    """Median env and learner steps/s over `args.repeats` runs, and every run's figures; with
    `warm_up`, after a run that is not kept, of one env step per env: every batch size's
    programs compile in any run, whatever its budget (the node's end waits for them)."""
    if warm_up:
        pipeline(factory, platform_name, args.transport, argparse.Namespace(
            num_actors=num_actors, envs_per_actor=args.envs_per_actor,
            env_steps=num_actors * args.envs_per_actor), learn=True)
    run_args = argparse.Namespace(num_actors=num_actors, envs_per_actor=args.envs_per_actor,
                                  env_steps=args.env_steps)
    runs = [pipeline(factory, platform_name, args.transport, run_args, learn=True)
            for _ in range(args.repeats)]
    return {
        "env_steps_per_s": statistics.median(r["env_steps_per_s"] for r in runs),
        "learner_steps_per_s": statistics.median(r["learner_steps_per_s"] for r in runs),
        "runs": runs,
    }


def plot(results: dict, platforms: list[str], workers: list[int], cores: int, title: str,
         path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for i, name in enumerate(platforms):
        color = f"C{i}"
        rates = [results[name][str(n)]["env_steps_per_s"] for n in workers]
        ax.plot(workers, rates, "o-", color=color, label=name)
        ax.plot(workers, [rates[0] * n for n in workers], ":", color=color, alpha=0.6,
                label=f"{name}, linear from 1 worker")
    ax.axvline(cores, color="grey", linestyle="--", linewidth=1)
    ax.annotate(f"{cores} cores", (cores, 0), xytext=(4, 4), textcoords="offset points",
                xycoords=("data", "axes fraction"), color="grey")
    ax.set_xticks(workers)
    ax.set_xlabel("env workers")
    ax.set_ylabel("env steps/s (full IMPALA pipeline)")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--platforms", default="local_mp,ray")
    p.add_argument("--max_workers", type=int, default=None,
                   help="last worker count (default: the number of cores)")
    p.add_argument("--workers", default=None,
                   help="the worker counts to run, comma-separated (default: 1..max_workers)")
    p.add_argument("--sleep_ms", type=float, default=None,
                   help="run the sleep env sleep:MS in place of --env")
    p.add_argument("--envs_per_actor", type=int, default=32)
    p.add_argument("--env_steps", type=int, default=200_000)
    p.add_argument("--transport", default="shm", choices=("shm", "socket"),
                   help="how env workers reach inference (ExperimentConfig.transport)")
    p.add_argument("--repeats", type=int, default=1, help="runs per point; the median is kept")
    p.add_argument("--no_compile_cache", action="store_true",
                   help="compile every program afresh, with no warm-up run (run.py's flag; "
                   "default: run.py's cache, runs/.jax_cache)")
    # Not docs/scaling.png by default: a partial or exploratory run would overwrite the plot
    # docs/benchmarks.md shows (ask for it with --out docs/scaling.png).
    p.add_argument("--out", default="scaling.png")
    args = p.parse_args()

    cores = cpu_count()
    workers = (sorted({int(n) for n in args.workers.split(",")}) if args.workers
               else list(range(1, (args.max_workers or cores) + 1)))
    if workers[0] < 1:
        p.error(f"--workers: counts must be >= 1, got {args.workers}")
    platforms = args.platforms.split(",")
    if args.sleep_ms is not None:
        args.env = f"sleep:{args.sleep_ms:g}"
    factory = make_env_factory(args.env)
    # Here, not at the top: node processes re-run this module's top level (see throughput.py).
    from trellis.builders.experiments.session import compile_cache, compile_cache_dir

    cache = None if args.no_compile_cache else compile_cache_dir(os.path.join("runs", "scaling"))
    results: dict = {name: {} for name in platforms}
    load_start = os.getloadavg()
    with compile_cache(cache):
        # Worker counts in the outer loop: drift in the machine's load hits all platforms alike.
        for n in workers:
            for name in platforms:
                print(f"running {n} env worker(s) on {name} ...", flush=True)
                results[name][str(n)] = measure(factory, name, n, args, warm_up=bool(cache))
    load_end = os.getloadavg()

    machine = f"{platform.machine()}, {cores} cores"
    title = (f"IMPALA {args.env}, {args.envs_per_actor} envs per worker, {args.transport} "
             f"({machine})")
    plot(results, platforms, workers, cores, title, args.out)

    print()
    print(f"{args.env}, IMPALA, {args.envs_per_actor} envs per worker over {args.transport}, "
          f"{args.env_steps:,} env steps per run, median of {args.repeats}; {machine}")
    print(f"load average (1 min) {load_start[0]:.2f} at the start, {load_end[0]:.2f} at the end")
    print(f"compilation cache: {cache}, a warm-up run before each point" if cache
          else "compilation cache: none (--no_compile_cache), no warm-up")
    header = f"{'workers':>7}"
    for name in platforms:
        header += f"{name + ' env steps/s':>24}{f'vs {workers[0]}':>7}{'learner steps/s':>17}"
    ideal = None if args.sleep_ms is None else args.envs_per_actor / args.sleep_ms * 1000
    if ideal is not None:
        header += f"{'of ideal':>10}"
    print(header)
    for n in workers:
        row = f"{n:>7}"
        for name in platforms:
            r, first = results[name][str(n)], results[name][str(workers[0])]
            speedup = r["env_steps_per_s"] / first["env_steps_per_s"]
            row += (f"{r['env_steps_per_s']:>24,.0f}{speedup:>6.2f}x"
                    f"{r['learner_steps_per_s']:>17,.1f}")
            if ideal is not None:
                row += f"{r['env_steps_per_s'] / (ideal * n):>10.2f}"
        print(row)
    if ideal is not None:
        print(f"ideal: {ideal:,.0f} env steps/s per worker ({args.envs_per_actor} envs / "
              f"{args.sleep_ms:g} ms)")
    print(f"plot: {args.out}")
    print(json.dumps(rounded({
        "env": args.env,
        "sleep_ms": args.sleep_ms,
        "envs_per_actor": args.envs_per_actor,
        "env_steps": args.env_steps,
        "transport": args.transport,
        "repeats": args.repeats,
        "compile_cache": cache,
        "machine": machine,
        "cores": cores,
        "workers": workers,
        "load_avg_start": list(load_start),
        "load_avg_end": list(load_end),
        "results": results,
        "plot": args.out,
    })))


if __name__ == "__main__":
    main()
