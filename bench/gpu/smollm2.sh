#!/usr/bin/env bash
# SmolLM2-135M-Instruct on the GPU: the GGUF converted on the device (fp16, the CUDA default), then
# Ladder and onnxruntime-genai-cuda on that same directory, and the real server answering through
# the client. On the GPU host, once every ortgpu.part but the last is in /tmp/ortparts and both GGUF parts in
# /tmp/parts (`../shared/tools/split-for-device.sh` made them under .whl/parts/; one call each:
#   mkdir -p /tmp/parts && cp .whl/parts/SmolLM2-135M-Instruct.Q4_1.gguf.part.NN /tmp/parts/):
#   bash bench/gpu/smollm2.sh   (carry: the last .whl/ortgpu.part.NN, the genai wheel, .whl/gpu-env.sh,
#                                .whl/ortgpu.sha256, .whl/ortgpu.name, .whl/small (with the gguf
#                                wheel), .whl/parts/SmolLM2-135M-Instruct.Q4_1.gguf.sha256)
# Everything lands under $OUT: smollm2-results.{json,md}, serve-check.json, logs.
set -o pipefail
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
CACHE=/tmp/ladder-cache
. bench/gpu/prepare.sh
python3 -c 'import gguf, jinja2' || { echo "the converter needs gguf (and jinja2): add their wheels to .whl/small"; exit 1; }
# The GGUF where the default model's preparer looks for it; a wrong checksum stops here.
mkdir -p "$CACHE/downloads"
cat /tmp/parts/"$GGUF".part.* > "$CACHE/downloads/$GGUF" || exit 1
(cd "$CACHE/downloads" && sha256sum -c "$OLDPWD/.whl/parts/$GGUF.sha256") 2>&1 | tee "$OUT/gguf-check.txt" || exit 1
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c 'import onnxruntime as o, onnxruntime_genai as g, numpy, onnx
print("onnxruntime", o.__version__, "genai", getattr(g, "__version__", "?"), "numpy", numpy.__version__,
      "onnx", onnx.__version__)'; } 2>&1 | tee "$OUT/gpu-info.txt"
timeout "${BENCH_TIMEOUT:-420}" python3 -m bench.gpu.smollm2 --cache-root "$CACHE" --out "$OUT" ${BENCH_ARGS:-} \
  2>&1 | tee "$OUT/smollm2.log" | tail -40
echo "bench exit $?"
timeout "${SERVE_TIMEOUT:-120}" python3 -m bench.gpu.smollm2 serve-check "$CACHE" "$OUT" cuda 2>&1 | tail -3
echo "serve-check exit $?"
