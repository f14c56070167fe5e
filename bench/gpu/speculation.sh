#!/usr/bin/env bash
# Speculative decoding on the GPU host (issue #44), once ortgpu.part.* are in /tmp/ortparts:
#   bash bench/gpu/speculation.sh   (carry: the genai wheel, .whl/gpu-env.sh, .whl/ortgpu.sha256,
#                                    .whl/ortgpu.name, .whl/small)
# For each model (MODELS, default "16x2048 8b": the random fp16 decoders of bench/gpu/run.py),
# bench/experiments/verify_cost.py on the CUDA provider: the load-time probe's gaps (how far a
# verification row lies from a decode row here, which decides --speculate auto), what a
# verification forward of 2, 3, 5, 9 rows costs against a one-row step over 256 and 1,024 tokens,
# and a greedy A/B with and without prompt-lookup drafts on a prompt that repeats a passage.
set -o pipefail
. bench/gpu/prepare.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$OUT/gpu-info.txt"
for model in ${MODELS:-16x2048 8b}; do
  timeout "${BENCH_TIMEOUT:-240}" python3 -m bench.experiments.verify_cost --provider cuda \
    --model "gpu:$model" --out "$OUT/$model" > "$OUT/verify_cost-$model.log" 2>&1
  echo "$model exit $?"
  grep -v '\[info' "$OUT/verify_cost-$model.log" | tail -c 2500
done
