#!/usr/bin/env bash
# Schema-driven fuzzing of the REST API: schemathesis reads the server's own OpenAPI document,
# generates valid and invalid requests for every operation, and checks each answer: never a 5xx,
# only documented status codes, the documented content type, and a body matching the schema.
# Exits non-zero on any finding.
#
# Each backend (SQLite, then Postgres) gets a server on loopback with accounts on and a
# throwaway data directory (and, on Postgres, a throwaway database), fuzzed twice: as a plain
# user, then as an administrator, each with a personal token of its own.
#
# FUZZ_EXAMPLES (default 8) bounds the test cases per operation and run; FUZZ_BACKENDS (default
# "sqlite postgres") picks the backends; FUZZ_VENV is where the Python environment with
# schemathesis lives (kept between runs). Postgres is found as scripts/test.sh finds it:
# TEST_DATABASE_URL, else the local server as `postgres` (with the password test.sh gives that
# role on a fresh cluster, when it needs one).
set -euo pipefail

cd "$(dirname "$0")/.."

EXAMPLES="${FUZZ_EXAMPLES:-8}"
BACKENDS="${FUZZ_BACKENDS:-sqlite postgres}"
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

# Event streams (a run's, a sweep's, a followed log) never end on their own: schemathesis
# stops reading one when its request timeout has passed in total (or after a few events), so
# each gets a short one; every other request keeps the longer default.
cat >"$WORK/schemathesis.toml" <<'EOF'
[[operations]]
include-path-regex = "/(events|logs)$"
request-timeout = 3
max-stream-events = 5
EOF

# The fuzzing identity keeps its own token and account: the stateful phase follows links from
# `GET /api/v1/tokens` and `GET /api/v1/users` and would otherwise revoke that token, or disable
# or demote that user, halfway through, leaving the rest of the run at 401. Such a request is
# sent for an id that does not exist instead.
cat >"$WORK/fuzz_hooks.py" <<'EOF'
import os

import schemathesis

OWN_TOKEN_ID = os.environ.get("FUZZ_OWN_TOKEN_ID", "")
OWN_USER = os.environ.get("FUZZ_OWN_USER", "")


@schemathesis.hook
def before_call(context, case, kwargs):
    path = case.operation.path
    params = case.path_parameters
    if params is None:
        return
    if path.startswith("/api/v1/tokens/") and params.get("id") == OWN_TOKEN_ID:
        params["id"] = "0" * 32
    if path.startswith("/api/v1/users/") and params.get("name") == OWN_USER:
        params["name"] = "not-" + OWN_USER
EOF

ADMIN_TOKEN="fuzz-bootstrap-$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
PASSWORD="fuzz-password-$(python3 -c 'import secrets; print(secrets.token_hex(8))')"
DATA=""
SERVER_PID=""
PG_ADMIN_URL=""
PG_DB=""
stop_server() {
    if [ -n "$SERVER_PID" ]; then
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=""
    fi
    if [ -n "$PG_DB" ]; then
        psql -q "$PG_ADMIN_URL" -c "DROP DATABASE IF EXISTS \"$PG_DB\" WITH (FORCE)" >/dev/null 2>&1 || true
        PG_DB=""
    fi
    if [ -n "$DATA" ]; then
        rm -rf "$DATA"
        DATA=""
    fi
}
trap stop_server EXIT

# The URL of a reachable Postgres the fuzz run may create a database on.
find_postgres() {
    local candidates=()
    if [ -n "${TEST_DATABASE_URL:-}" ]; then
        candidates=("$TEST_DATABASE_URL")
    else
        candidates=("postgres://postgres@127.0.0.1:5432/postgres"
                    "postgres://postgres:postgres@127.0.0.1:5432/postgres")
    fi
    for url in "${candidates[@]}"; do
        if psql -q "$url" -c 'select 1' >/dev/null 2>&1; then
            echo "$url"
            return 0
        fi
    done
    echo "ERROR: no Postgres at ${candidates[*]}: run scripts/test.sh first (it starts one)," \
         "set TEST_DATABASE_URL, or set FUZZ_BACKENDS=sqlite" >&2
    return 1
}

# `base` with its database name replaced (any `?options` kept).
with_database() {
    python3 - "$1" "$2" <<'PY'
import sys
from urllib.parse import urlsplit, urlunsplit
parts = urlsplit(sys.argv[1])
print(urlunsplit(parts._replace(path="/" + sys.argv[2])))
PY
}

# Starts a server with accounts on for `$1` (sqlite or postgres); sets BASE.
start_server() {
    DATA="$(mktemp -d)"
    local port db_args=()
    port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    BASE="http://127.0.0.1:$port"
    if [ "$1" = postgres ]; then
        PG_ADMIN_URL="$(find_postgres)"
        PG_DB="trainyard_fuzz_$(python3 -c 'import secrets; print(secrets.token_hex(8))')"
        psql -q "$PG_ADMIN_URL" -c "CREATE DATABASE \"$PG_DB\"" >/dev/null
        db_args=(--database-url "$(with_database "$PG_ADMIN_URL" "$PG_DB")")
    fi
    # No GPUs and no CPU slots: fuzzed launch requests are validated and queued, but nothing
    # runs. Command launches stay off (the default), so the 403 path is fuzzed too.
    echo "==> starting trainyard serve ($1, accounts on) on $BASE"
    env -u DATABASE_URL -u TRAINYARD_ADMIN_TOKEN RUST_LOG="${RUST_LOG:-warn}" \
        TRAINYARD_ADMIN_TOKEN="$ADMIN_TOKEN" \
        "$BIN" serve --addr "127.0.0.1:$port" --data-dir "$DATA" --gpus "" --cpu-slots 0 \
        --auth --unconfined-runs "${db_args[@]}" >"$DATA/server.log" 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 1 300); do
        curl -sf "$BASE/healthz" >/dev/null 2>&1 && break
        sleep 0.1
    done
    curl -sf "$BASE/healthz" >/dev/null || { cat "$DATA/server.log" >&2; exit 1; }
}

# Creates user `$1` (an administrator when `$2` is true), signs it in and prints a personal
# token of its own: its secret and its id.
user_token() {
    python3 - "$BASE" "$ADMIN_TOKEN" "$1" "$2" "$PASSWORD" <<'PY'
import json, sys, urllib.request
base, admin, name, is_admin, password = sys.argv[1:]
def call(path, body, headers):
    request = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json", **headers})
    with urllib.request.urlopen(request) as response:
        return response, json.load(response)
call("/api/v1/users", {"name": name, "password": password, "admin": is_admin == "true"},
     {"authorization": f"Bearer {admin}"})
response, session = call("/api/v1/session", {"name": name, "password": password}, {})
cookie = response.headers["set-cookie"].split(";")[0]
_, created = call("/api/v1/tokens", {"name": "fuzz", "scope": "write"},
                  {"cookie": cookie, "x-csrf-token": session["csrf_token"]})
print(created["secret"], created["token"]["id"])
PY
}

# Fuzzes the server at BASE as user `$2` with token `$3` (its id `$4`); `$1` names the run.
fuzz_as() {
    echo "==> schemathesis as $1 ($EXAMPLES examples per operation)"
    (cd "$WORK" && SCHEMATHESIS_HOOKS="$WORK/fuzz_hooks.py" FUZZ_OWN_USER="$2" FUZZ_OWN_TOKEN_ID="$4" \
        "$VENV/bin/schemathesis" --config-file "$WORK/schemathesis.toml" \
        run "$BASE/api/v1/openapi.json" \
        --header "Authorization: Bearer $3" \
        --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
        --max-examples "$EXAMPLES" \
        --exclude-path /api/v1/events \
        --request-timeout 20 \
        --seed "${FUZZ_SEED:-20260101}" \
        --workers 2 \
        --generation-database none \
        --no-color)
}

status=0
for backend in $BACKENDS; do
    start_server "$backend"
    # The plain user first: the administrator's run may disable other users.
    for who in fuzz-user fuzz-admin; do
        is_admin=false
        role=user
        if [ "$who" = fuzz-admin ]; then
            is_admin=true
            role=administrator
        fi
        credentials="$(user_token "$who" "$is_admin")"
        read -r secret token_id <<<"$credentials"
        # `GET /api/v1/events` is an endless stream of every run's status changes with no
        # answer to check but its headers: left out.
        if ! fuzz_as "$role on $backend" "$who" "$secret" "$token_id"; then
            status=1
            echo "==> fuzzing found problems as $role on $backend (server log follows)" >&2
            tail -n 200 "$DATA/server.log" >&2
        fi
    done
    stop_server
done
exit "$status"
