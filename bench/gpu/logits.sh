#!/usr/bin/env bash
# Logits only for the rows that are read, on the GPU host, once every ortgpu.part but the last is in /tmp/ortparts:
#   bash bench/gpu/logits.sh     (carry: the last .whl/ortgpu.part.NN, the genai wheel, .whl/gpu-env.sh,
#                                 .whl/ortgpu.sha256, .whl/ortgpu.name, .whl/small, .bench-baseline)
# installs onnxruntime-gpu, runs the GPU tests, then bench/gpu/logits.py on the 16x2048 fp16 decoder
# (vocab 32000): device memory per prefill variant (captured graphs included) and prefill time per
# chunk, this version beside the previous release (.bench-baseline = `git archive <rev> engine
# service proto`), and whether their greedy tokens agree. Everything lands under $OUT.
set -o pipefail
. bench/gpu/prepare.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$OUT/gpu-info.txt"
timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -m gpu -q -p no:cacheprovider tests/engine/test_cuda_graphs.py \
  tests/engine/test_cuda_prefix.py tests/engine/test_cuda_outputs.py \
  2>&1 | tee "$OUT/gpu-tests.log" | tail -5
baseline=(); [ -d .bench-baseline/engine ] && baseline=(--baseline-root "$PWD/.bench-baseline")
timeout "${BENCH_TIMEOUT:-300}" python3 -m bench.gpu.logits --provider cuda --model "${MODEL:-16x2048}" \
  "${baseline[@]}" --out "$OUT" > "$OUT/logits.log" 2>&1
echo "bench exit $?"
tail -c 6000 "$OUT/logits.log"
