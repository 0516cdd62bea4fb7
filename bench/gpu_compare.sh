#!/usr/bin/env bash
# Side-by-side GPU training throughput, in one go on one machine: Trainyard (a `--features cuda`
# build of `trainyard`) against PyTorch eager and torch.compile on the same model shape.
#
# usage: bench/gpu_compare.sh TRAINYARD_BINARY [PROFILE...]      (default: medium small-moe)
#   STEPS (default 30), BATCH (default 8), PRECISION (default bf16), DEVICE (default cuda)
# Prints one JSON line per measurement. The binary needs CUDA's libraries on its path (on a
# machine whose PyTorch ships them, run it through ../shared/cuda/run-on-gpu.sh or set
# LD_LIBRARY_PATH to that site-packages' nvidia/cu13/lib).
set -euo pipefail
bin=${1:?usage: bench/gpu_compare.sh TRAINYARD_BINARY [PROFILE...]}
shift
profiles=("${@:-medium}")
[ $# -eq 0 ] && profiles=(medium small-moe)
root=$(cd "$(dirname "$0")/.." && pwd)
steps=${STEPS:-30}
batch=${BATCH:-8}
precision=${PRECISION:-bf16}
device=${DEVICE:-cuda}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for profile in "${profiles[@]}"; do
  out="$work/$profile"
  # Random tokens are enough for timing; `dummy` data keeps tokenization out of the measurement.
  "$bin" train --config "$profile" --out "$out" \
    --set training.device="$device" --set training.precision="$precision" \
    --set training.batch_size="$batch" --set training.max_steps="$((steps + 5))" \
    --set training.eval_steps=0 --set training.save_steps=0 --set training.warmup_steps=0 --set data.dataset=dummy \
    --set data.tokenizer=bytes --set logging.progress=never >"$work/$profile.log" 2>&1 || {
      cat "$work/$profile.log" >&2; exit 1; }
  python3 - "$out/metrics.jsonl" "$profile" "$precision" "$batch" <<'PY'
import json, statistics, sys
path, profile, precision, batch = sys.argv[1:]
lines = [json.loads(l) for l in open(path)]
warm = [l["metrics"] for l in lines[5:]]  # the first steps include allocation and kernel loading
tps = statistics.median(m["perf/tokens_per_s"] for m in warm)
mfu = [m["perf/mfu"] for m in warm if "perf/mfu" in m]
print(json.dumps({"impl": "trainyard", "profile": profile, "precision": precision,
                  "batch_size": int(batch), "steps": len(warm), "tokens_per_s": round(tps, 1),
                  "mfu": round(statistics.median(mfu), 4) if mfu else None,
                  "final_loss": round(warm[-1]["train/loss"], 4)}))
PY
  if [ "$device" = cuda ]; then
    for mode in eager compile; do
      # The resolved config Trainyard wrote: both sides build exactly the same shape.
      python3 "$root/bench/torch_gpu.py" --profile "$out/config.yaml" --mode "$mode" \
        --precision "$precision" --batch-size "$batch" --steps "$steps"
    done
  fi
done
