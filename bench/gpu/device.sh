#!/usr/bin/env bash
# The one device command: on the GPU host, once every ortgpu.part but the last is in /tmp/ortparts,
#   bash bench/gpu/device.sh        (carry: the last .whl/ortgpu.part.NN, the genai wheel, .whl/gpu-env.sh,
#                                    .whl/ortgpu.sha256, .whl/ortgpu.name, .whl/small)
# installs onnxruntime-gpu + onnxruntime-genai-cuda, runs the GPU tests and the benchmark;
# everything lands under $OUT.
set -o pipefail
. bench/gpu/prepare.sh
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c 'import onnxruntime as o, onnxruntime_genai as g, cupy, numpy, onnx
print("onnxruntime", o.__version__, "genai", getattr(g, "__version__", "?"), "cupy", cupy.__version__,
      "numpy", numpy.__version__, "onnx", onnx.__version__)'; } 2>&1 | tee "$OUT/gpu-info.txt"
timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -m gpu -q -p no:cacheprovider tests/engine/test_cuda_graphs.py \
  2>&1 | tee "$OUT/gpu-tests.log"
timeout "${BENCH_TIMEOUT:-480}" python3 -m bench.gpu.run --out "$OUT" ${MODELS:+--models $MODELS} 2>&1 \
  | tee "$OUT/gpu-run.log"
