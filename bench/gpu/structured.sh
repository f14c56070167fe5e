#!/usr/bin/env bash
# The structured-output device command: on the GPU host, once every ortgpu.part but the last is in /tmp/ortparts,
#   bash bench/gpu/structured.sh   (carry: the last .whl/ortgpu.part.NN, the genai wheel, .whl/gpu-env.sh,
#                                   .whl/ortgpu.sha256, .whl/ortgpu.name, .whl/small)
# installs onnxruntime-gpu, runs every GPU test, then bench/structured.py on the 16x2048 fp16 decoder
# at 16 and 64 streams (none, half and all rows constrained, side by side).
set -o pipefail
. bench/gpu/prepare.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$OUT/gpu-info.txt"
timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -rs -m gpu -p no:cacheprovider \
  $(grep -l "mark.gpu" -r tests --include='*.py' | grep test_) 2>&1 | tee "$OUT/gpu-tests.log" | tail -15
timeout "${BENCH_TIMEOUT:-240}" python3 -m bench.structured --provider cuda --model "gpu:${MODEL:-16x2048}" \
  --streams "${STREAMS:-16,64}" --tokens 48 --repeats 3 --out "$OUT" > "$OUT/structured.log" 2>&1
echo "bench exit $?"
tail -c 3000 "$OUT/structured.log"
