#!/usr/bin/env bash
# What the GPU work measures, in one go on a machine with an NVIDIA GPU: the device and driver,
# the CUDA test suite (each kernel against candle's primitives, training on the GPU against the
# CPU, bf16 against f32), then bench/gpu_compare.sh (Trainyard with each kernel set beside
# PyTorch eager and torch.compile, same shapes).
#
# usage: bench/gpu_check.sh TRAINYARD_BINARY [CUDA_TEST_BINARY]
#   PROFILES (default "medium small-moe") and the variables of bench/gpu_compare.sh
# Build both binaries with scripts/build-cuda.sh (the test binary:
#   scripts/build-cuda.sh --tests, see that script). CUDA's libraries must be on the library path.
set -uo pipefail
bin=${1:?usage: bench/gpu_check.sh TRAINYARD_BINARY [CUDA_TEST_BINARY]}
tests=${2:-}
root=$(cd "$(dirname "$0")/.." && pwd)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'
grep -m1 "model name" /proc/cpuinfo
status=0
if [ -n "$tests" ]; then
  echo "== CUDA tests"
  "$tests" --test-threads=1 --nocapture || status=1
fi
echo "== throughput"
# shellcheck disable=SC2086 # PROFILES is a list
bash "$root/bench/gpu_compare.sh" "$bin" ${PROFILES:-medium small-moe} || status=1
exit $status
