#!/usr/bin/env bash
# Trainer CPU throughput vs PyTorch eager, same shape, 2 threads, one after the other.
# Usage: bench/cpu_vs_torch.sh [--moe]   (needs python3 with torch installed)
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS="${THREADS:-2}"
STEPS="${STEPS:-30}"
echo "machine: $(uname -m), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
cargo bench -p trainyard-trainer --bench train_speed -- --threads "$THREADS" --steps "$STEPS" "$@"
python3 bench/torch_gpt.py --threads "$THREADS" --steps "$STEPS" --attention sdpa "$@"
python3 bench/torch_gpt.py --threads "$THREADS" --steps "$STEPS" --attention manual "$@"
