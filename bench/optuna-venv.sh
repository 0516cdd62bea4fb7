#!/usr/bin/env bash
# Creates (once) a Python virtual environment holding Optuna at a pinned version with what its
# GP sampler needs (SciPy, PyTorch on the CPU), for the side-by-side search-quality benchmark
# (bench/sweep_quality.py).
#
# usage: bench/optuna-venv.sh        (OPTUNA_VENV overrides the location, default target/optuna-venv)
# The last line printed is the path of the venv's python.
set -euo pipefail

cd "$(dirname "$0")/.."

OPTUNA_VERSION=5.0.0
SCIPY_VERSION=1.17.1
TORCH_VERSION=2.15.0
venv="${OPTUNA_VENV:-target/optuna-venv}"
case "$venv" in
  /*) ;;
  *) venv="$PWD/$venv" ;;
esac
python="$venv/bin/python"

installed() {
  "$python" - <<'PY' 2>/dev/null || true
import importlib.metadata as m
try:
    print(m.version("optuna"), m.version("scipy"), m.version("torch"))
except Exception:
    pass
PY
}

want="$OPTUNA_VERSION $SCIPY_VERSION $TORCH_VERSION"
if [ -x "$python" ] && [ "$(installed)" = "$want" ]; then
  echo "optuna, scipy and torch ($want) already present in $venv" >&2
else
  echo "==> creating $venv with optuna==$OPTUNA_VERSION scipy==$SCIPY_VERSION torch==$TORCH_VERSION" >&2
  python3 -m venv "$venv"
  "$python" -m pip install --quiet --upgrade pip
  "$python" -m pip install --quiet "optuna==$OPTUNA_VERSION" "scipy==$SCIPY_VERSION" "torch==$TORCH_VERSION"
  [ "$(installed)" = "$want" ] || {
    echo "ERROR: optuna/scipy/torch ($want) did not install into $venv" >&2
    exit 1
  }
fi

echo "$python"
