#!/usr/bin/env bash
# Creates (once) a Python virtual environment with NumPy and the `safetensors` package at pinned
# versions: the independent references of the trainer's tests (trainer/tests/reference/*.py) run
# in it, e.g. the NumPy forward pass of an exported Hugging Face checkpoint.
#
# usage: scripts/reference-venv.sh   (REFERENCE_VENV overrides the location, default target/reference-venv)
# The last line printed is the path of the venv's python.
set -euo pipefail

cd "$(dirname "$0")/.."

NUMPY_VERSION=2.2.6
SAFETENSORS_VERSION=0.5.3
venv="${REFERENCE_VENV:-target/reference-venv}"
case "$venv" in
  /*) ;;
  *) venv="$PWD/$venv" ;;
esac
python="$venv/bin/python"

installed() {
  "$python" - <<'PY' 2>/dev/null || true
import importlib.metadata as m
try:
    print(m.version("numpy"), m.version("safetensors"))
except Exception:
    pass
PY
}

if [ -x "$python" ] && [ "$(installed)" = "$NUMPY_VERSION $SAFETENSORS_VERSION" ]; then
  echo "numpy $NUMPY_VERSION and safetensors $SAFETENSORS_VERSION already present in $venv" >&2
else
  echo "==> creating $venv with numpy==$NUMPY_VERSION safetensors==$SAFETENSORS_VERSION" >&2
  python3 -m venv "$venv"
  "$python" -m pip install --quiet --upgrade pip
  "$python" -m pip install --quiet "numpy==$NUMPY_VERSION" "safetensors==$SAFETENSORS_VERSION"
  [ "$(installed)" = "$NUMPY_VERSION $SAFETENSORS_VERSION" ] || {
    echo "ERROR: numpy/safetensors did not install into $venv" >&2
    exit 1
  }
fi

echo "$python"
