#!/usr/bin/env bash
# Issue 21's checks on a 16-core GPU machine, with the commands docs/benchmarks.md records,
# most telling first (a device lease is short, so a run that is cut off has done the most):
#   pong      Pong with --preset=atari and 14 workers to a mean return of 18, from a cold start
#             (the first run on a fresh machine compiles everything): the first update within
#             10 s of launch, 18 within 15 minutes at >= 52,000 frames/s; then one warm start.
#   scaling   full IMPALA on CartPole, 1 and 14 workers: >= 6x.
#   cartpole  run.py's default run to 450 with 14 and with 2 workers, alternated over three
#             seeds: 14 workers faster in wall time.
#   startup   not a check: Pong's cold start (and then its steady rate) with run.py's XLA_FLAGS
#             and with XLA's Triton matmuls off (cuBLAS's instead, which XLA does not autotune
#             per tile), each with a compilation cache of its own: what of the cold start's
#             compiles is the autotuning of matmuls.
# Usage: benchmarks/big_machine.sh [pong] [scaling] [cartpole] [startup]
#        (pong, scaling and cartpole when none is named)
# PYTHON picks the interpreter (default: python3); PONG_BUDGET_S the Pong run's budget (default
# 900, the check's 15 minutes). Each benchmark's output goes to the terminal and to
# $OUT/<part>.log ($OUT: default /tmp/big_machine).
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}
out=${OUT:-/tmp/big_machine}
mkdir -p "$out"
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(pong scaling cartpole)
for part in "${parts[@]}"; do
  case $part in pong|scaling|cartpole|startup) ;;
    *) echo "unknown part $part: expected pong, scaling, cartpole or startup" >&2; exit 2 ;;
  esac
done
# Pong's runs keep their directories, and so their compilation cache, here: the first is cold.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

nvidia-smi -L 2>/dev/null || echo "no nvidia-smi: not a GPU machine"
echo "cores: $(nproc); HEAD $(git rev-parse --short HEAD 2>/dev/null || echo '?'); $(date -u)"
for part in "${parts[@]}"; do
  echo "== $part, $(date -u +%H:%M:%S) UTC"
  case $part in
    pong)
      "$py" benchmarks/atari.py --num_actors=14 --budget_s="${PONG_BUDGET_S:-900}" --curve_s=30 \
        --logdir="$scratch/pong_cold"
      # The same start-up again, its programs now in the compilation cache.
      "$py" benchmarks/atari.py --num_actors=14 --budget_s=40 --curve_s=30 \
        --logdir="$scratch/pong_warm" ;;
    scaling)
      "$py" benchmarks/scaling.py --platforms=local_mp --workers=1,14 --env_steps=1000000 \
        --out="$out/scaling.png" ;;
    cartpole)
      for seed in 0 1 2; do
        for workers in 14 2; do
          "$py" benchmarks/time_to_solve.py --platforms=local_mp --seeds="$seed" -- \
            --num_actors="$workers"
        done
      done ;;
    startup)
      for flags in "" "--xla_gpu_enable_triton_gemm=false"; do
        echo "-- XLA_FLAGS=$flags"
        mkdir -p "$scratch/startup"
        XLA_FLAGS=$flags "$py" benchmarks/atari.py --num_actors=14 --budget_s=45 --curve_s=30 \
          --logdir="$(mktemp -d -p "$scratch/startup")/run"
      done ;;
  esac 2>&1 | tee "$out/$part.log"
done
