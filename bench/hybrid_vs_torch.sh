#!/usr/bin/env bash
# Trainer CPU throughput of the tiny-hybrid profile vs a PyTorch eager model of the same layers
# (bench/torch_hybrid.py), same shapes and thread count, interleaved rounds.
# Usage: bench/hybrid_vs_torch.sh   (PYTHON names a python with torch; default python3)
# Env: THREADS (2), STEPS (20), WARMUP (3), ROUNDS (3).
#
# PyTorch runs twice per round, with its defaults and with OMP_WAIT_POLICY=PASSIVE (see
# bench/cpu_vs_torch.sh for why).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
THREADS="${THREADS:-2}"
STEPS="${STEPS:-20}"
WARMUP="${WARMUP:-3}"
ROUNDS="${ROUNDS:-3}"
echo "machine: $(uname -m), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
cargo bench -p trainyard-trainer --bench hybrid_speed --no-run
args=(--threads "$THREADS" --steps "$STEPS" --warmup "$WARMUP")
for round in $(seq "$ROUNDS"); do
    echo "round $round, load average: $(cut -d' ' -f1-3 /proc/loadavg)"
    cargo bench -q -p trainyard-trainer --bench hybrid_speed -- "${args[@]}"
    "$PYTHON" bench/torch_hybrid.py "${args[@]}"
    OMP_WAIT_POLICY=PASSIVE "$PYTHON" bench/torch_hybrid.py "${args[@]}" | sed 's/"impl": "pytorch"/"impl": "pytorch, OMP_WAIT_POLICY=PASSIVE"/'
done
