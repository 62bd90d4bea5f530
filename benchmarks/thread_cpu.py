"""CPU time per env step of every thread of the acting pipeline (throughput.py's), steady.

A rate on 2 cores swings by a fifth between runs of one commit; the CPU a thread spends per env
step moves far less, so it tells where a regression's time went (docs/benchmarks.md, "The
regression, continued"). Every process of the run (the launcher, and on local_mp each node)
reads its threads' CPU times from /proc/self/task every `--period_s` into a file of its own:
a `sitecustomize` module on PYTHONPATH starts that thread in each Python process, and again in
each process forked from one. Each thread's CPU over the run's steady window (the last
`steady_s` of its process's samples) is divided by the env steps of that window.

    python benchmarks/thread_cpu.py [--platform=local_mp] [--transport=shm] [--learn=1]

Linux only (/proc). Threads are named by Python's `threading` names where they have one, else
by the OS's (XLA's pools: the process's name or `tf_*`).
"""

from __future__ import annotations

import argparse
import collections
import glob
import importlib.util
import json
import os
import sys
import tempfile
import textwrap

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# 200k env steps (5-7 s): the learner compiles larger batch sizes until 20-60k steps in, and the
# steady window opens after the last compile, so 20k left it empty or 0.1-0.4 s long.
SMOKE_FLAGS = ["--platform=local_mt", "--env_steps=200000"]

_DIR_VARIABLE = "TRELLIS_THREAD_CPU_DIR"

# The sampler, as the `sitecustomize` of every Python process of the run.
_SAMPLER = textwrap.dedent(f"""
    import os, threading, time

    def _sample(directory, period_s):
        tick = os.sysconf("SC_CLK_TCK")
        path = os.path.join(directory, f"{{os.getpid()}}.txt")
        while True:
            names = {{t.native_id: t.name for t in threading.enumerate()}}
            now, lines = time.time(), []
            for tid in os.listdir("/proc/self/task"):
                try:
                    with open(f"/proc/self/task/{{tid}}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                    with open(f"/proc/self/task/{{tid}}/comm") as f:
                        comm = f.read().strip()
                except OSError:  # The thread ended meanwhile.
                    continue
                name = names.get(int(tid), comm).replace(" ", "_")
                cpu_s = (int(fields[11]) + int(fields[12])) / tick  # utime + stime.
                lines.append(f"{{now:.3f}} {{tid}} {{name}} {{cpu_s:.3f}}\\n")
            try:
                with open(path, "a") as f:
                    f.writelines(lines)
            except FileNotFoundError:  # The benchmark ended (processes outlive it: the
                return                 # fork server).
            time.sleep(period_s)

    def start():
        directory = os.environ.get("{_DIR_VARIABLE}")
        if directory:
            period_s = float(os.environ.get("{_DIR_VARIABLE}_PERIOD", "0.25"))
            threading.Thread(target=_sample, args=(directory, period_s), daemon=True,
                             name="thread_cpu").start()

    start()
    os.register_at_fork(after_in_child=start)
""")


def thread_cpu(path: str, steady_s: float) -> dict[str, float]:
    """{"name (tid)": CPU seconds} over the last `steady_s` of one process's samples."""
    series: dict[tuple[str, str], list[tuple[float, float]]] = collections.defaultdict(list)
    with open(path) as f:
        for line in f:
            when, tid, name, cpu_s = line.split()
            series[(tid, name)].append((float(when), float(cpu_s)))
    end = max(when for samples in series.values() for when, _ in samples)
    used = {}
    for (tid, name), samples in series.items():
        before = [cpu_s for when, cpu_s in samples if when <= end - steady_s]
        used[f"{name} ({tid})"] = samples[-1][1] - (before[-1] if before else 0.0)
    return used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--platform", default="local_mp", choices=("local_mp", "local_mt"))
    parser.add_argument("--transport", default="shm", choices=("shm", "socket"))
    parser.add_argument("--learn", type=int, default=1, help="0: acting alone")
    parser.add_argument("--num_actors", type=int, default=2)
    parser.add_argument("--envs_per_actor", type=int, default=32)
    parser.add_argument("--env_steps", type=int, default=300_000)
    parser.add_argument("--period_s", type=float, default=0.25)
    args = parser.parse_args()

    # A node process may still be writing its samples while the directory goes.
    with (tempfile.TemporaryDirectory() as site,
          tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as out):
        with open(os.path.join(site, "sitecustomize.py"), "w") as f:
            f.write(_SAMPLER)
        # Before any node process starts: local_mp's fork server and nodes inherit both.
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (site, os.environ.get("PYTHONPATH")) if p)
        os.environ[_DIR_VARIABLE], os.environ[f"{_DIR_VARIABLE}_PERIOD"] = out, str(args.period_s)
        # This process's sampler (loading the module starts it), under a name of its own: a
        # `sitecustomize` may be imported already.
        spec = importlib.util.spec_from_file_location(
            "thread_cpu_sampler", os.path.join(site, "sitecustomize.py"))
        assert spec is not None and spec.loader is not None
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        # JAX only now, as throughput.py does: its import is no part of what is measured.
        from throughput import pipeline

        from trellis.envs import GymnasiumFactory

        result = pipeline(GymnasiumFactory(args.env), args.platform, args.transport, args,
                          bool(args.learn))
        steady_s, rate = result["steady_s"], result["steady_env_steps_per_s"]
        if not steady_s:
            raise SystemExit("the run ended before its first update: no steady window")
        steps = steady_s * rate
        processes = {os.path.basename(p): thread_cpu(p, steady_s)
                     for p in sorted(glob.glob(os.path.join(out, "*.txt")))}

    print(f"{args.env}, {args.platform} over {args.transport}, "
          f"{'full IMPALA' if args.learn else 'acting alone'}: {rate:,.0f} env steps/s steady "
          f"over {steady_s:.1f} s")
    per_step = {}
    for process, threads in processes.items():
        busy = {name: cpu_s for name, cpu_s in threads.items() if cpu_s >= 0.05}
        if not busy:
            continue
        total = sum(threads.values())
        per_step[process] = {name: 1e6 * cpu_s / steps for name, cpu_s in busy.items()}
        print(f"process {process}: {total:.2f} CPU s, {1e6 * total / steps:.2f} us per env step")
        for name, cpu_s in sorted(busy.items(), key=lambda kv: -kv[1]):
            print(f"    {name:<32} {cpu_s:6.2f} s {1e6 * cpu_s / steps:7.2f} us per env step")
    print(json.dumps({"steady_env_steps_per_s": rate, "steady_s": steady_s,
                      "us_per_env_step": per_step}))


if __name__ == "__main__":
    main()
