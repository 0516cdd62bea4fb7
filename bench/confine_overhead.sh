#!/usr/bin/env bash
# What confining launched runs costs a user: two `trainyard serve` processes on loopback, one as
# a server starts by default (runs confined with Landlock) and one with --unconfined-runs, get the
# same `trainyard submit --follow` launches, alternated, ROUNDS times each. For every run it
# prints
#   - launch_ms: the run's `started_at - created_at` (admission, queue, spawn, the trainer's
#     first report), from the server's own record;
#   - wall_s: the submit command's wall time, launch to final status;
#   - tokens_per_s: the median `perf/tokens_per_s` of the run's steps after WARMUP, from its own
#     metrics.jsonl.
# Usage: bench/confine_overhead.sh [ROUNDS] (TRAINYARD=path/to/trainyard, default the debug build).
set -euo pipefail

cd "$(dirname "$0")/.."
ROUNDS="${1:-5}"
STEPS="${STEPS:-60}"
WARMUP="${WARMUP:-10}"
BIN="${TRAINYARD:-target/debug/trainyard}"
[ -x "$BIN" ] || { echo "no trainyard binary at $BIN (cargo build first)" >&2; exit 1; }

work="$(mktemp -d)"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
# A copy: a rebuild while the benchmark runs must not replace the binary under the servers.
cp "$BIN" "$work/trainyard"
BIN="$work/trainyard"

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "cores: $(nproc); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "binary: $BIN; steps: $STEPS (median over steps > $WARMUP); rounds: $ROUNDS"

# Starts a server and prints its URL once it listens.
start() {
    local name="$1"
    shift
    mkdir -p "$work/$name"
    "$BIN" serve --addr 127.0.0.1:0 --data-dir "$work/$name" --gpus 0 --cpu-slots 1 "$@" \
        > "$work/$name.log" 2>&1 &
    pids+=("$!")
    for _ in $(seq 1 200); do
        local port
        port="$(grep -o 'addr=127.0.0.1:[0-9]*' "$work/$name.log" | head -1 | cut -d: -f2 || true)"
        if [ -n "$port" ]; then
            echo "http://127.0.0.1:$port"
            return
        fi
        sleep 0.1
    done
    echo "server $name did not start:" >&2
    cat "$work/$name.log" >&2
    exit 1
}

confined_url="$(start confined)"
unconfined_url="$(start unconfined --unconfined-runs)"
curl -sf "$confined_url/healthz" | grep -q '"runs_confined":true' || {
    echo "the default server does not confine runs on this kernel" >&2
    exit 1
}

# One launch through `trainyard submit --follow`; prints a JSON line of its figures.
one() {
    local mode="$1" url="$2"
    local start end out id
    start="$(date +%s.%N)"
    out="$("$BIN" submit --server "$url" --profile tiny --experiment bench \
        --set training.max_steps="$STEPS" --set training.save_steps=0 \
        --set training.eval_steps=0 --set training.device=cpu --set training.threads=1 \
        --set data.dataset=dummy --follow 2>&1 || true)"
    end="$(date +%s.%N)"
    id="$(printf '%s\n' "$out" | sed -n 's/^run \([0-9a-f]\{32\}\) queued$/\1/p' | head -1)"
    if [ -z "$id" ] || [ ! -e "$work/$mode/runs/$id/metrics.jsonl" ]; then
        echo "{\"mode\": \"$mode\", \"error\": \"no run figures\"}"
        printf '%s\n' "$out" | tail -5 >&2
        return
    fi
    curl -sf "$url/api/v1/runs/$id" > "$work/run.json"
    python3 - "$work/run.json" "$work/$mode/runs/$id/metrics.jsonl" "$WARMUP" "$mode" \
        "$start" "$end" <<'PY'
import json, statistics, sys
run = json.load(open(sys.argv[1]))
warmup = int(sys.argv[3])
rates = []
for line in open(sys.argv[2]):
    rec = json.loads(line)
    if rec.get("step", 0) > warmup and "perf/tokens_per_s" in rec.get("metrics", {}):
        rates.append(rec["metrics"]["perf/tokens_per_s"])
print(json.dumps({
    "mode": sys.argv[4],
    "status": run["status"],
    "launch_ms": run["started_at"] - run["created_at"],
    "wall_s": round(float(sys.argv[6]) - float(sys.argv[5]), 2),
    "tokens_per_s": round(statistics.median(rates), 1),
}))
PY
}

for round in $(seq 1 "$ROUNDS"); do
    # Alternate which goes first, so a drift in the machine's load hits both alike.
    if [ $((round % 2)) -eq 1 ]; then
        one confined "$confined_url"
        one unconfined "$unconfined_url"
    else
        one unconfined "$unconfined_url"
        one confined "$confined_url"
    fi
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
