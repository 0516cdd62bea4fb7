#!/usr/bin/env bash
# Runs the whole test suite, including the Postgres tests (never skipped: if Postgres cannot be
# installed or reached, this script fails) and the MLflow client tests (the client is installed
# from the Python package index into target/mlflow-venv).
set -euo pipefail

cd "$(dirname "$0")/.."

PG_URL="${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

pg_ready() {
    pg_isready -q -d "$PG_URL" 2>/dev/null
}

ensure_postgres() {
    if ! command -v pg_ctlcluster >/dev/null 2>&1 && ! command -v pg_isready >/dev/null 2>&1; then
        echo "==> installing PostgreSQL"
        as_root apt-get update -q
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql
    fi
    if pg_ready; then
        return 0
    fi
    echo "==> starting PostgreSQL"
    if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
        for version in /etc/postgresql/*; do
            as_root pg_ctlcluster --skip-systemctl-redirect "$(basename "$version")" main start || true
        done
    fi
    pg_ready || as_root service postgresql start || true
    for _ in $(seq 1 30); do
        pg_ready && break
        sleep 1
    done
    if ! pg_ready; then
        echo "ERROR: PostgreSQL is not reachable at $PG_URL; the Postgres tests cannot run." >&2
        exit 1
    fi
    # A fresh Debian cluster asks for a password on TCP: give the local `postgres` role one
    # (through the peer-authenticated socket) and use it, unless a URL was given explicitly.
    if ! psql "$PG_URL" -c 'select 1' >/dev/null 2>&1 && [ -z "${TEST_DATABASE_URL:-}" ]; then
        echo "==> setting a password for the postgres role (loopback test use)"
        as_root runuser -u postgres -- psql -q -c "ALTER USER postgres PASSWORD 'postgres'" || true
        PG_URL="postgres://postgres:postgres@127.0.0.1:5432/postgres"
    fi
    if ! psql "$PG_URL" -c 'select 1' >/dev/null 2>&1; then
        echo "ERROR: cannot log in to $PG_URL (configure trust or set TEST_DATABASE_URL)." >&2
        exit 1
    fi
}

# The browser tests drive Debian's Chromium over WebDriver; charts render text with DejaVu.
ensure_browser() {
    local missing=()
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
    command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
    [ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || missing+=(fonts-dejavu-core)
    command -v fc-list >/dev/null 2>&1 || missing+=(fontconfig)
    if [ ${#missing[@]} -gt 0 ]; then
        echo "==> installing ${missing[*]}"
        as_root apt-get update -q
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
    fi
}

ensure_postgres
export TEST_DATABASE_URL="$PG_URL"
echo "==> Postgres tests use $TEST_DATABASE_URL"

ensure_browser

# The Slurm executor's tests submit jobs to a real one-node cluster (munge, slurmctld, slurmd,
# started here without systemd); never skipped: the script fails when Slurm does not come up.
echo "==> Slurm"
scripts/slurm-up.sh

# The MLflow compatibility tests drive the official `mlflow` Python client (pinned there).
echo "==> MLflow client"
TRAINYARD_MLFLOW_PYTHON="$(scripts/mlflow-venv.sh | tail -n 1)"
export TRAINYARD_MLFLOW_PYTHON

# The trainer's independent references (NumPy reading safetensors, as transformers does) run in
# their own pinned environment; the tests fail, never skip, without it.
echo "==> NumPy reference"
TRAINYARD_REFERENCE_PYTHON="$(scripts/reference-venv.sh | tail -n 1)"
export TRAINYARD_REFERENCE_PYTHON

echo "==> cargo test --workspace"
cargo test --workspace "$@"
