#!/usr/bin/env bash
# The prefix-reuse device command: on the GPU host, once every ortgpu.part but the last is in /tmp/ortparts,
#   bash bench/gpu/prefix.sh     (carry: the last .whl/ortgpu.part.NN, the genai wheel, .whl/gpu-env.sh,
#                                 .whl/ortgpu.sha256, .whl/ortgpu.name, .whl/small)
# installs onnxruntime-gpu, runs the GPU prefix tests, then bench/prefix.py on the 16x2048 fp16 decoder:
# a 2,000-token shared system prompt + 100-token turns with prefix sharing on and off, the 10th chat turn
# appended to a live session vs resent whole, and ForkSession of a 4,000-token session (server time).
#   MODEL=default bash bench/gpu/prefix.sh   serves SmolLM2-135M-Instruct (fp16, converted on the device)
# instead; it needs both GGUF parts in /tmp/parts (as for bench/gpu/smollm2.sh, whose comment says how)
# and carries .whl/parts/SmolLM2-135M-Instruct.Q4_1.gguf.sha256 and the gguf wheel in .whl/small.
# TESTS=0 skips the GPU tests.
set -o pipefail
. bench/gpu/prepare.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$OUT/gpu-info.txt"
if [ "${TESTS:-1}" = 1 ]; then
  timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -m gpu -q -p no:cacheprovider tests/engine/test_cuda_prefix.py \
    2>&1 | tee "$OUT/gpu-tests.log" | tail -5
fi
model=(--model "gpu:${MODEL:-16x2048}")
if [ "${MODEL:-}" = default ]; then
  GGUF=SmolLM2-135M-Instruct.Q4_1.gguf CACHE=/tmp/ladder-cache
  mkdir -p "$CACHE/downloads"
  [ -s "$CACHE/downloads/$GGUF" ] || cat /tmp/parts/"$GGUF".part.* > "$CACHE/downloads/$GGUF" || exit 1
  (cd "$CACHE/downloads" && sha256sum -c "$OLDPWD/.whl/parts/$GGUF.sha256") || exit 1
  model=(--model default --precision fp16 --cache "$CACHE")
fi
python3 -m bench.experiments.grpc_floor --out "$OUT" > /dev/null 2>&1 || echo "grpc floor failed"
timeout "${BENCH_TIMEOUT:-360}" python3 -m bench.prefix --provider cuda "${model[@]}" \
  --capacity 8192 --slots 8 --chunk-sizes "${CHUNKS:-512}" --requests 10 --forks 20 --out "$OUT" ${BENCH_ARGS:-} \
  > "$OUT/prefix.log" 2>&1
echo "bench exit $?"
tail -c 3000 "$OUT/prefix.log"
