#!/usr/bin/env bash
# Builds the `trainyard` binary with candle's CUDA kernels (`--features cuda`).
#
# Works on a machine with no GPU and no system CUDA: if no toolkit is found (nvcc on PATH or
# CUDA_HOME), it evaluates the output of the set-up script CUDA_TOOLKIT_SETUP names, which
# installs a toolkit (for example CUDA 13.0 from PyPI wheels) and prints the build environment
# (PATH, CUDA_HOME, LIBRARY_PATH).
# The CPU build (`cargo build --release`) stays the default and needs none of this.
#
# usage: scripts/build-cuda.sh [--tests] [extra cargo args]
#   --tests            also build the trainer's GPU test binary (trainer/tests/cuda.rs); cargo
#                      prints its path ("Executable tests/cuda.rs (...)")
#   CUDA_COMPUTE_CAP   target compute capability (default 90: H100/H200)
#   CARGO_TARGET_DIR   where to build (default target-cuda, kept apart from the CPU build)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

if ! command -v nvcc >/dev/null 2>&1 && [ ! -x "${CUDA_HOME:-/nonexistent}/bin/nvcc" ]; then
  setup=${CUDA_TOOLKIT_SETUP:-}
  if [ -z "$setup" ] || [ ! -x "$setup" ]; then
    echo "build-cuda: no CUDA toolkit (nvcc) found, and CUDA_TOOLKIT_SETUP names no set-up script" >&2
    echo "build-cuda: install CUDA 13.0 or set CUDA_TOOLKIT_SETUP" >&2
    exit 1
  fi
  cargo fetch --quiet   # the set-up script reads cudarc's sources for its link stub
  eval "$("$setup")"
fi
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target-cuda}
tests=false
if [ "${1:-}" = --tests ]; then
  tests=true
  shift
fi
cargo build --release --features cuda --bin trainyard "$@"
if $tests; then
  cargo test --release --features cuda -p trainyard-trainer --test cuda --no-run "$@"
fi
echo "built $CARGO_TARGET_DIR/release/trainyard (CUDA, compute capability $CUDA_COMPUTE_CAP)"
