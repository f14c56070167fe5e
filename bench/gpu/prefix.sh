#!/usr/bin/env bash
# The prefix-reuse device command: on the GPU host, once ortgpu.part.00-03 are in /tmp/ortparts,
#   bash bench/gpu/prefix.sh     (carry: .whl/ortgpu.part.04, the genai wheel, .whl/gpu-env.sh,
#                                 .whl/ortgpu.sha256, .whl/ortgpu.name, .whl/small)
# installs onnxruntime-gpu, runs the GPU prefix tests, then bench/prefix.py on the 16x2048 fp16 decoder:
# a 2,000-token shared system prompt + 100-token turns with prefix sharing on and off, the 10th chat turn
# appended to a live session vs resent whole, and ForkSession of a 4,000-token session (server time).
set -o pipefail
. bench/gpu/prepare.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$OUT/gpu-info.txt"
timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -m gpu -q -p no:cacheprovider tests/engine/test_cuda_prefix.py \
  2>&1 | tee "$OUT/gpu-tests.log" | tail -5
timeout "${BENCH_TIMEOUT:-360}" python3 -m bench.prefix --provider cuda --model "gpu:${MODEL:-16x2048}" \
  --capacity 8192 --slots 8 --chunk-sizes "${CHUNKS:-512}" --requests 10 --forks 20 --out "$OUT" ${BENCH_ARGS:-} \
  > "$OUT/prefix.log" 2>&1
echo "bench exit $?"
tail -c 4000 "$OUT/prefix.log"
