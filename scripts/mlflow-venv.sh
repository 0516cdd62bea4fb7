#!/usr/bin/env bash
# Creates (once) a Python virtual environment holding the official MLflow client/server at a pinned
# version, for the MLflow compatibility scenario (server/tests/mlflow/scenario.py) and the ingest
# benchmark (bench/mlflow_compare.sh). psycopg2-binary lets MLflow's own server use Postgres.
#
# usage: scripts/mlflow-venv.sh        (MLFLOW_VENV overrides the location, default target/mlflow-venv)
# The last line printed is the path of the venv's python.
set -euo pipefail

cd "$(dirname "$0")/.."

MLFLOW_VERSION=3.17.2
venv="${MLFLOW_VENV:-target/mlflow-venv}"
case "$venv" in
  /*) ;;
  *) venv="$PWD/$venv" ;;
esac
python="$venv/bin/python"

installed_version() {
  "$python" - <<'PY' 2>/dev/null || true
import importlib.metadata as m
try:
    import psycopg2  # noqa: F401  (the server-on-Postgres half needs it too)
    print(m.version("mlflow"))
except Exception:
    pass
PY
}

if [ -x "$python" ] && [ "$(installed_version)" = "$MLFLOW_VERSION" ]; then
  echo "mlflow $MLFLOW_VERSION already present in $venv" >&2
else
  echo "==> creating $venv with mlflow==$MLFLOW_VERSION" >&2
  python3 -m venv "$venv"
  "$python" -m pip install --quiet --upgrade pip
  "$python" -m pip install --quiet "mlflow==$MLFLOW_VERSION" psycopg2-binary
  [ "$(installed_version)" = "$MLFLOW_VERSION" ] || {
    echo "ERROR: mlflow $MLFLOW_VERSION did not install into $venv" >&2
    exit 1
  }
fi

echo "$python"
