#!/usr/bin/env bash
# Side-by-side GPU training throughput, in one go on one machine: Trainyard (a `--features cuda`
# build of `trainyard`) against PyTorch eager and torch.compile on the same model shape.
#
# usage: bench/gpu_compare.sh TRAINYARD_BINARY [PROFILE...]      (default: medium small-moe)
#   STEPS (default 30), BATCH (default 8), PRECISION (default bf16), DEVICE (default cuda)
#   KERNEL_SETS   values of TRAINYARD_CUDA_KERNELS to time Trainyard with, space-separated
#                 (default "all"; e.g. "none all" gives each kernel set's effect)
#   TORCH_MODES   PyTorch modes to time (default "eager compile"; empty for none)
# Prints one JSON line per measurement. Both sides train without gradient accumulation and without
# dropout on random tokens, from the resolved config Trainyard wrote. The binary needs CUDA's
# libraries on its path (on a machine whose PyTorch ships them, set LD_LIBRARY_PATH to that
# site-packages' nvidia/cu13/lib).
set -euo pipefail
bin=${1:?usage: bench/gpu_compare.sh TRAINYARD_BINARY [PROFILE...]}
shift
profiles=("$@")
[ $# -eq 0 ] && profiles=(medium small-moe)
root=$(cd "$(dirname "$0")/.." && pwd)
steps=${STEPS:-30}
batch=${BATCH:-8}
precision=${PRECISION:-bf16}
device=${DEVICE:-cuda}
kernel_sets=${KERNEL_SETS:-all}
torch_modes=${TORCH_MODES-eager compile}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for profile in "${profiles[@]}"; do
  for kernels in $kernel_sets; do
    out="$work/$profile-$kernels"
    # Random tokens are enough for timing; `dummy` data keeps tokenization out of the measurement.
    TRAINYARD_CUDA_KERNELS=$kernels "$bin" train --config "$profile" --out "$out" \
      --set training.device="$device" --set training.precision="$precision" \
      --set training.batch_size="$batch" --set training.grad_accum_steps=1 --set model.dropout=0 \
      --set training.max_steps="$((steps + 5))" \
      --set training.eval_steps=0 --set training.save_steps=0 --set training.warmup_steps=0 \
      --set data.dataset=dummy --set data.tokenizer=bytes --set logging.progress=never \
      >"$out.log" 2>&1 || { cat "$out.log" >&2; exit 1; }
    python3 - "$out/metrics.jsonl" "$profile" "$precision" "$batch" "$kernels" <<'PY'
import json, statistics, sys
path, profile, precision, batch, kernels = sys.argv[1:]
lines = [json.loads(l) for l in open(path)]
steps = [l["metrics"] for l in lines if "perf/tokens_per_s" in l["metrics"]]
warm = steps[5:]  # the first steps include allocation and kernel loading
tps = statistics.median(m["perf/tokens_per_s"] for m in warm)
mfu = [m["perf/mfu"] for m in warm if "perf/mfu" in m]
mem = [m["perf/gpu_mem_peak_gib"] for m in warm if "perf/gpu_mem_peak_gib" in m]
print(json.dumps({"impl": "trainyard", "kernels": kernels, "profile": profile,
                  "precision": precision, "batch_size": int(batch), "steps": len(warm),
                  "tokens_per_s": round(tps, 1),
                  "mfu": round(statistics.median(mfu), 4) if mfu else None,
                  "peak_mem_gib": round(max(mem), 3) if mem else None,
                  "final_loss": round(warm[-1]["train/loss"], 4),
                  # with TRAINYARD_PROFILE=phases: median milliseconds per phase of a step
                  **{k[len("perf/ms/"):] + "_ms": round(statistics.median(m[k] for m in warm if k in m), 2)
                     for k in sorted({k for m in warm for k in m if k.startswith("perf/ms/")})}}),
      flush=True)
PY
    config="$out/config.yaml"
  done
  if [ "$device" = cuda ]; then
    for mode in $torch_modes; do
      # The resolved config Trainyard wrote: both sides build exactly the same shape.
      python3 "$root/bench/torch_gpu.py" --profile "$config" --mode "$mode" \
        --precision "$precision" --batch-size "$batch" --steps "$steps"
    done
  fi
done
