#!/usr/bin/env bash
# Trainer CPU throughput vs PyTorch eager, same shape and thread count, interleaved rounds.
# Usage: bench/cpu_vs_torch.sh [--moe]   (needs python3 with torch installed)
# Env: THREADS (2), STEPS (20), WARMUP (3), ROUNDS (3).
#
# PyTorch runs twice per round: with its defaults, and with OMP_WAIT_POLICY=PASSIVE (its
# OpenMP workers sleep instead of spinning between ops, which on a 2-core machine with any
# other load is several times faster). Trainyard's pool spins briefly by default.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS="${THREADS:-2}"
STEPS="${STEPS:-20}"
WARMUP="${WARMUP:-3}"
ROUNDS="${ROUNDS:-3}"
echo "machine: $(uname -m), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
cargo bench -p trainyard-trainer --bench train_speed --no-run
args=(--threads "$THREADS" --steps "$STEPS" --warmup "$WARMUP" "$@")
for round in $(seq "$ROUNDS"); do
    echo "round $round, load average: $(cut -d' ' -f1-3 /proc/loadavg)"
    cargo bench -q -p trainyard-trainer --bench train_speed -- "${args[@]}"
    python3 bench/torch_gpt.py "${args[@]}" --attention sdpa
    OMP_WAIT_POLICY=PASSIVE python3 bench/torch_gpt.py "${args[@]}" --attention sdpa | sed 's/"impl": "pytorch"/"impl": "pytorch, OMP_WAIT_POLICY=PASSIVE"/'
done
