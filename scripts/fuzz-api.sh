#!/usr/bin/env bash
# Schema-driven fuzzing of the REST API: schemathesis reads the server's own OpenAPI document,
# generates valid and invalid requests for every operation, and checks each answer: never a 5xx,
# only documented status codes, the documented content type, and a body matching the schema.
# Exits non-zero on any finding. Talks to a server on loopback with a throwaway data directory.
#
# FUZZ_EXAMPLES (default 20) bounds the test cases per operation; FUZZ_VENV is where the Python
# environment with schemathesis lives (kept between runs).
set -euo pipefail

cd "$(dirname "$0")/.."

EXAMPLES="${FUZZ_EXAMPLES:-20}"
VENV="${FUZZ_VENV:-target/fuzz-venv}"
SCHEMATHESIS_VERSION="4.32.5"

echo "==> building trainyard"
cargo build --quiet --bin trainyard
TARGET="$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
BIN="$TARGET/debug/trainyard"
# schemathesis keeps its replay cache in its working directory: keep that out of the source tree.
WORK="$TARGET/fuzz"
mkdir -p "$WORK"

case "$VENV" in /*) ;; *) VENV="$PWD/$VENV" ;; esac
if [ ! -x "$VENV/bin/schemathesis" ] || ! "$VENV/bin/schemathesis" --version | grep -q "$SCHEMATHESIS_VERSION"; then
    echo "==> installing schemathesis $SCHEMATHESIS_VERSION into $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet "schemathesis==$SCHEMATHESIS_VERSION"
fi

DATA="$(mktemp -d)"
PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
BASE="http://127.0.0.1:$PORT"
SERVER_PID=""
cleanup() {
    if [ -n "$SERVER_PID" ]; then
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    rm -rf "$DATA"
}
trap cleanup EXIT

# No GPUs and no CPU slots: fuzzed launch requests are validated and queued, but nothing runs.
# Command launches stay off (the default), so the 403 path is fuzzed too.
echo "==> starting trainyard serve on $BASE"
env -u DATABASE_URL -u TRAINYARD_ADMIN_TOKEN RUST_LOG="${RUST_LOG:-warn}" \
    "$BIN" serve --addr "127.0.0.1:$PORT" --data-dir "$DATA" --gpus "" --cpu-slots 0 \
    >"$DATA/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 1 300); do
    curl -sf "$BASE/healthz" >/dev/null 2>&1 && break
    sleep 0.1
done
curl -sf "$BASE/healthz" >/dev/null || { cat "$DATA/server.log" >&2; exit 1; }

# `GET /api/v1/events` is an endless stream of every run's status changes: there is no answer
# to check, only headers, so it is left out (the per-run streams answer 404 for unknown ids).
echo "==> schemathesis ($EXAMPLES examples per operation)"
status=0
(cd "$WORK" && "$VENV/bin/schemathesis" run "$BASE/api/v1/openapi.json" \
    --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
    --max-examples "$EXAMPLES" \
    --exclude-path /api/v1/events \
    --request-timeout 20 \
    --seed "${FUZZ_SEED:-20260101}" \
    --workers 2 \
    --generation-database none \
    --no-color) || status=$?
if [ "$status" -ne 0 ]; then
    echo "==> fuzzing found problems (server log follows)" >&2
    tail -n 200 "$DATA/server.log" >&2
fi
exit "$status"
