#!/usr/bin/env bash
# The batching device command: on the GPU host, once every ortgpu.part but the last is in /tmp/ortparts,
#   bash bench/gpu/batching.sh     (carry: the last .whl/ortgpu.part.NN, the genai wheel, .whl/gpu-env.sh,
#                                   .whl/ortgpu.sha256, .whl/ortgpu.name, .whl/small, .bench-baseline)
# installs onnxruntime-gpu, runs the GPU tests, then bench/batching.py on the 16x2048 fp16 decoder
# (the previous release's service side by side when .bench-baseline holds its engine/ service/ proto/).
set -o pipefail
. bench/gpu/prepare.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$OUT/gpu-info.txt"
timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -m gpu -q -p no:cacheprovider tests/engine/test_cuda_graphs.py \
  2>&1 | tee "$OUT/gpu-tests.log" | tail -5
baseline=(); [ -d .bench-baseline/engine ] && baseline=(--baseline-root "$PWD/.bench-baseline")
timeout "${BENCH_TIMEOUT:-400}" python3 -m bench.batching --provider cuda --model "gpu:${MODEL:-16x2048}" \
  "${baseline[@]}" --out "$OUT" ${BENCH_ARGS:-} > "$OUT/batching.log" 2>&1
echo "bench exit $?"
tail -c 6000 "$OUT/batching.log"
# The same service with lookahead off: does the batch's agreement with runs alone depend on it?
if [ -n "${NOLOOKAHEAD:-}" ]; then
  mkdir -p "$OUT/nolookahead"
  timeout 200 python3 -m bench.batching --provider cuda --model "gpu:${MODEL:-16x2048}" --streams 1,4,16 \
    --server-args "--lookahead false" --skip load,soak,engine,numerics,raw --out "$OUT/nolookahead" \
    > "$OUT/nolookahead/batching.log" 2>&1
  echo "no-lookahead bench exit $?"
fi
