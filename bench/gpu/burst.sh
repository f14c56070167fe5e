#!/usr/bin/env bash
# The burst device command (issue 28): on the GPU host, once every ortgpu.part but the last is in /tmp/ortparts,
#   bash bench/gpu/burst.sh   (carry: the last .whl/ortgpu.part.NN, the genai wheel, .whl/gpu-env.sh,
#                              .whl/ortgpu.sha256, .whl/ortgpu.name, .whl/small)
# the GPU tests of prompts sharing a prefill forward, one forward of B prompts timed (B = 1..16),
# then 64 simultaneous 512-token prompts on the 16x2048 fp16 decoder, served with --prefill-batch 1,
# 4, 8 and 16 one after the other (the same requests), and a lognormal-length burst with 1 and 8.
set -o pipefail
. bench/gpu/prepare.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$OUT/gpu-info.txt"
timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -q -rs -m gpu -p no:cacheprovider \
  tests/engine/test_cuda_prompt_batches.py tests/engine/test_cuda_prefix.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -6
timeout 120 python3 -m bench.gpu.prompt_forwards --model 16x2048 --width 512 --sizes 1,2,4,8,16 \
  --out "$OUT" 2>&1 | grep -v "^\s*$" | tail -6
for pb in ${BATCHES:-1 4 8 16}; do
  timeout 100 python3 -m bench.serving --provider cuda --model gpu:16x2048 --precision fp16 --max-sessions 64 \
    --rates "" --burst 64 --prompt-len 512 --output-len 128 --server-args "--prefill-batch $pb" \
    --out "$OUT/burst-64x512-pb$pb" > "$OUT/burst-64x512-pb$pb.log" 2>&1
  echo "pb $pb exit $?"; grep "^burst" "$OUT/burst-64x512-pb$pb.log" | cut -c1-400
done
for pb in ${SHAREGPT_BATCHES-1 8}; do
  timeout 100 python3 -m bench.serving --provider cuda --model gpu:16x2048 --precision fp16 --max-sessions 64 \
    --rates "" --burst 64 --server-args "--prefill-batch $pb" \
    --out "$OUT/burst-64-sharegpt-pb$pb" > "$OUT/burst-64-sharegpt-pb$pb.log" 2>&1
  echo "sharegpt pb $pb exit $?"; grep "^burst" "$OUT/burst-64-sharegpt-pb$pb.log" | cut -c1-400
done
