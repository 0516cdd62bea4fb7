#!/usr/bin/env bash
# Side-by-side MLflow-API ingest and history-read throughput: MLflow's own tracking server against
# Trainyard. Both run on the same Postgres, each on a fresh database, and are driven by the same
# client, bench/mlflow_ingest.py.
#
# usage: bench/mlflow_compare.sh
#   ROUNDS (default 2)                each round runs MLflow, then Trainyard
#   CLIENTS (4) BATCHES (50) WARMUP_BATCHES (2) HISTORY_POINTS (5000) HISTORY_REPS (20)
#                                     passed to bench/mlflow_ingest.py
#   TRAINYARD_BIN (target/release/trainyard)
#   MLFLOW_WORKERS                    mlflow server --workers (default: MLflow's own default)
#   PG_HOST (127.0.0.1) PG_PORT (5432) PG_USER (postgres)    a Postgres that trusts PG_USER
#   ONLY=mlflow | ONLY=trainyard      run only one side (no ratios)
#   TRAINYARD_TOKEN                   sent as MLFLOW_TRACKING_TOKEN to Trainyard, if set
# Everything listens on 127.0.0.1 only. Servers, databases and temporary files are removed on exit.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

rounds=${ROUNDS:-2}
clients=${CLIENTS:-4}
batches=${BATCHES:-50}
warmup_batches=${WARMUP_BATCHES:-2}
history_points=${HISTORY_POINTS:-5000}
history_reps=${HISTORY_REPS:-20}
trainyard_bin=${TRAINYARD_BIN:-target/release/trainyard}
pg_host=${PG_HOST:-127.0.0.1}
pg_port=${PG_PORT:-5432}
pg_user=${PG_USER:-postgres}
only=${ONLY:-}

run_mlflow=1
run_trainyard=1
case "$only" in
  "") ;;
  mlflow) run_trainyard=0 ;;
  trainyard) run_mlflow=0 ;;
  *) echo "ONLY must be mlflow or trainyard" >&2; exit 2 ;;
esac
if [ "$run_trainyard" = 1 ] && [ ! -x "$trainyard_bin" ]; then
  echo "ERROR: $trainyard_bin not found; build it with 'cargo build --release' (or ONLY=mlflow)" >&2
  exit 1
fi

py=$(scripts/mlflow-venv.sh | tail -n 1)
venv_bin=$(dirname "$py")

work=$(mktemp -d)
suffix="$$_$(date +%s)"
mlflow_db="mlflow_bench_$suffix"
trainyard_db="trainyard_bench_$suffix"
pids=()
dbs=()

cleanup() {
  local status=$?
  set +e
  for pid in "${pids[@]}"; do
    # Each server was started in its own session: stop its whole process group (workers too).
    kill -TERM -- "-$pid" 2>/dev/null
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$pid" 2>/dev/null
  done
  for db in "${dbs[@]}"; do
    dropdb -h "$pg_host" -p "$pg_port" -U "$pg_user" --if-exists --force "$db" 2>/dev/null \
      || dropdb -h "$pg_host" -p "$pg_port" -U "$pg_user" --if-exists "$db"
  done
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
  "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Starts "$@" in a new session (its own process group), logging to $1.log; prints its pid.
start_server() {
  local log=$1
  shift
  setsid "$@" >"$log" 2>&1 </dev/null &
  echo $!
}

wait_healthy() {
  local name=$1 url=$2 pid=$3 log=$4
  for _ in $(seq 1 240); do
    if curl -sf -o /dev/null "$url"; then return 0; fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "ERROR: $name exited before it was healthy; last lines of $log:" >&2
      tail -n 40 "$log" >&2
      exit 1
    fi
    sleep 0.5
  done
  echo "ERROR: $name not healthy at $url after 120 s; last lines of $log:" >&2
  tail -n 40 "$log" >&2
  exit 1
}

echo "== machine"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//') ($(nproc) cores)"
echo "mlflow: $("$py" -c 'import mlflow; print(mlflow.__version__)')"
[ "$run_trainyard" = 1 ] && echo "trainyard: $("$trainyard_bin" --version 2>/dev/null || echo "$trainyard_bin")"
echo "postgres: $(psql -h "$pg_host" -p "$pg_port" -U "$pg_user" -Atc 'show server_version' postgres)"

pg_url="$pg_user@$pg_host:$pg_port"
if [ "$run_mlflow" = 1 ]; then
  createdb -h "$pg_host" -p "$pg_port" -U "$pg_user" "$mlflow_db"
  dbs+=("$mlflow_db")
  mlflow_port=$(free_port)
  mkdir -p "$work/mlflow"
  # SQLAlchemy 2.1 defaults postgresql:// to psycopg 3; the venv ships psycopg2, named explicitly.
  mlflow_cmd=("$venv_bin/mlflow" server
    --backend-store-uri "postgresql+psycopg2://$pg_url/$mlflow_db"
    --artifacts-destination "$work/mlflow/artifacts"
    --host 127.0.0.1 --port "$mlflow_port")
  if [ -n "${MLFLOW_WORKERS:-}" ]; then mlflow_cmd+=(--workers "$MLFLOW_WORKERS"); fi
  echo "== starting MLflow: (cd $work/mlflow && ${mlflow_cmd[*]})"
  pid=$(cd "$work/mlflow" && start_server "$work/mlflow.log" "${mlflow_cmd[@]}")
  pids+=("$pid")
  wait_healthy MLflow "http://127.0.0.1:$mlflow_port/health" "$pid" "$work/mlflow.log"
fi
if [ "$run_trainyard" = 1 ]; then
  createdb -h "$pg_host" -p "$pg_port" -U "$pg_user" "$trainyard_db"
  dbs+=("$trainyard_db")
  trainyard_port=$(free_port)
  mkdir -p "$work/trainyard"
  trainyard_cmd=("$trainyard_bin" serve
    --addr "127.0.0.1:$trainyard_port"
    --data-dir "$work/trainyard/data"
    --database-url "postgres://$pg_url/$trainyard_db"
    --gpus "" --cpu-slots 0)
  echo "== starting Trainyard: (cd $work/trainyard && ${trainyard_cmd[*]})"
  pid=$(cd "$work/trainyard" && start_server "$work/trainyard.log" "${trainyard_cmd[@]}")
  pids+=("$pid")
  wait_healthy Trainyard "http://127.0.0.1:$trainyard_port/healthz" "$pid" "$work/trainyard.log"
fi

results="$work/results.jsonl"
bench_args=(--clients "$clients" --batches "$batches" --warmup-batches "$warmup_batches"
  --history-points "$history_points" --history-reps "$history_reps")

bench() {
  local label=$1 port=$2
  local cmd=("$py" bench/mlflow_ingest.py "http://127.0.0.1:$port" --label "$label" "${bench_args[@]}")
  if [ "$label" = trainyard-native ]; then cmd+=(--native); fi
  echo "-- $label: ${cmd[*]}"
  if [ "$label" != mlflow ] && [ -n "${TRAINYARD_TOKEN:-}" ]; then
    MLFLOW_TRACKING_TOKEN="$TRAINYARD_TOKEN" "${cmd[@]}" | tee -a "$results"
  else
    env -u MLFLOW_TRACKING_TOKEN "${cmd[@]}" | tee -a "$results"
  fi
}

for round in $(seq 1 "$rounds"); do
  echo "== round $round/$rounds, loadavg: $(cat /proc/loadavg)"
  [ "$run_mlflow" = 1 ] && bench mlflow "$mlflow_port"
  if [ "$run_trainyard" = 1 ]; then
    echo "   loadavg: $(cat /proc/loadavg)"
    bench trainyard "$trainyard_port"
    echo "   loadavg: $(cat /proc/loadavg)"
    bench trainyard-native "$trainyard_port"
  fi
done

echo "== summary (median over rounds)"
"$py" - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
fields = ["ingest_metrics_per_s", "ingest_batch_ms_p50", "history_requests_per_s", "history_points_per_s"]
med = {}
for label in sorted({r["label"] for r in rows}):
    mine = [r for r in rows if r["label"] == label]
    med[label] = {f: round(statistics.median(r[f] for r in mine), 2) for f in fields}
    print(json.dumps({"label": label, "rounds": len(mine), **med[label]}))
if "mlflow" in med and "trainyard" in med:
    ratios = {f: round(med["trainyard"][f] / med["mlflow"][f], 2) for f in fields if med["mlflow"][f]}
    print(json.dumps({"ratio": "trainyard / mlflow", **ratios}))
if "trainyard-native" in med and "trainyard" in med:
    f = "ingest_metrics_per_s"
    print(json.dumps({"ratio": "trainyard log-batch / trainyard native", f:
                      round(med["trainyard"][f] / med["trainyard-native"][f], 2)}))
PY
