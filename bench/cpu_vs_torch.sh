#!/usr/bin/env bash
# Trainer CPU throughput of the product command (`trainyard train`) vs PyTorch eager, same shape
# and thread count, interleaved rounds.
#
# Usage: bench/cpu_vs_torch.sh [--moe]
# Env: THREADS (2), STEPS (30, timed), WARMUP (10, untimed), ROUNDS (3),
#      PYTHON (python3; needs torch), TRAINYARD (a built binary; default: build the release one),
#      BENCH_BINARY (1: also run the `train_speed` bench binary, which times `Trainer::step`
#      alone; 0: skip it), TRAIN_SPEED (a built bench binary; default: build it).
#
# `trainyard train` runs the benchmark shape (bench/torch_gpt.py's, built from the tiny profiles
# with overrides) for WARMUP + STEPS steps and its figures come from its own metrics.jsonl:
# `tokens_per_s` is the median of `perf/tokens_per_s` (the step's own clock) over the timed
# steps, `wall_tokens_per_s` counts the wall time between the lines of the timed steps, so
# anything the command does between steps shows there.
#
# PyTorch runs twice per round: with its defaults, and with OMP_WAIT_POLICY=PASSIVE (its
# OpenMP workers sleep instead of spinning between ops, which on a 2-core machine with any
# other load is several times faster). Trainyard's pool spins briefly by default.
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS="${THREADS:-2}"
STEPS="${STEPS:-30}"
WARMUP="${WARMUP:-10}"
ROUNDS="${ROUNDS:-3}"
PYTHON="${PYTHON:-python3}"
BENCH_BINARY="${BENCH_BINARY:-1}"
moe=0
for arg in "$@"; do
    case "$arg" in
        --moe) moe=1 ;;
        *) echo "unknown argument $arg (only --moe)" >&2; exit 2 ;;
    esac
done

echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores, $(uname -m)"
# Two vCPUs of a cloud VM are often the two hyperthreads of one core (then a GEMM-bound step
# gains little from its second thread), and AVX-512 decides which GEMM kernel runs.
threads_per_core="$(lscpu 2>/dev/null | sed -n 's/^Thread(s) per core: *//p' || true)"
if grep -qw avx512f /proc/cpuinfo; then simd="AVX-512 (kernels::sgemm)"; else simd="no AVX-512 (the gemm crate's AVX2 kernel)"; fi
echo "threads per core: ${threads_per_core:-unknown}; ${simd}"
echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [ -z "${TRAINYARD:-}" ]; then
    cargo build -q --release -p trainyard
    TRAINYARD=target/release/trainyard
fi
if [ "$BENCH_BINARY" != 0 ] && [ -z "${TRAIN_SPEED:-}" ]; then
    TRAIN_SPEED="$(cargo bench -q -p trainyard-trainer --bench train_speed --no-run \
        --message-format=json | "$PYTHON" -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "train_speed" and m["executable"]:
        print(m["executable"])')"
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
profile=tiny
shape=dense
if [ "$moe" = 1 ]; then
    profile=tiny-moe
    shape=moe
fi
# The shape of trainer/benches/train_speed.rs and bench/torch_gpt.py; no evaluation or
# checkpoint until the last step, no progress bar or step lines (log_every beyond the run).
cli_args=(
    train --config "$profile" --out "$work/run"
    --set model.d_model=128 --set model.n_layers=4 --set model.n_heads=4
    --set model.d_ff=512 --set model.max_seq_len=128
    --set training.batch_size=16 --set training.seq_len=128
    --set training.max_steps=$((WARMUP + STEPS)) --set training.warmup_steps=0
    --set training.eval_steps=0 --set training.save_steps=0
    --set training.device=cpu --set training.threads="$THREADS"
    --set logging.progress=never --set logging.log_every=1000000
)
bench_args=(--threads "$THREADS" --steps "$STEPS" --warmup "$WARMUP")
[ "$moe" = 1 ] && bench_args+=(--moe)

# One JSON line from the run's metrics.jsonl (the timed steps are WARMUP+1 .. WARMUP+STEPS; the
# last one also evaluates and checkpoints after its line's clock, so wall time stops a step early).
cli_report() {
    "$PYTHON" - "$work/run/metrics.jsonl" "$WARMUP" "$THREADS" "$shape" <<'PY'
import json, statistics, sys
path, warmup, threads, shape = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
lines = [json.loads(l) for l in open(path)]
steps = [l for l in lines if l["step"] > warmup and "perf/tokens_per_s" in l["metrics"]]
rates = [l["metrics"]["perf/tokens_per_s"] for l in steps]
tokens_per_step = 16 * 128
first = next(l for l in lines if l["step"] == warmup)
wall = [l for l in steps if l["step"] < steps[-1]["step"]]
wall_s = (wall[-1]["time"] - first["time"]) / 1000
median = statistics.median(rates)
print(json.dumps({
    "impl": "trainyard train",
    "shape": shape,
    "threads": threads,
    "steps": len(steps),
    "step_ms": round(1000 * tokens_per_step / median, 2),
    "tokens_per_s": round(median, 1),
    "wall_tokens_per_s": round(tokens_per_step * len(wall) / wall_s, 1),
    "final_loss": round(steps[-1]["metrics"]["train/loss"], 4),
}))
PY
}

torch_args=(--threads "$THREADS" --steps "$STEPS" --warmup "$WARMUP" --attention sdpa)
[ "$moe" = 1 ] && torch_args+=(--moe)
for round in $(seq "$ROUNDS"); do
    echo "round $round, load average: $(cut -d' ' -f1-3 /proc/loadavg)"
    rm -rf "$work/run"
    "$TRAINYARD" "${cli_args[@]}" 2>"$work/train.log" || { cat "$work/train.log" >&2; exit 1; }
    cli_report
    if [ "$BENCH_BINARY" != 0 ]; then
        "$TRAIN_SPEED" "${bench_args[@]}" |
            sed 's/"impl":"trainyard"/"impl":"train_speed bench binary"/'
    fi
    "$PYTHON" bench/torch_gpt.py "${torch_args[@]}"
    OMP_WAIT_POLICY=PASSIVE "$PYTHON" bench/torch_gpt.py "${torch_args[@]}" |
        sed 's/"impl": "pytorch"/"impl": "pytorch, OMP_WAIT_POLICY=PASSIVE"/'
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
