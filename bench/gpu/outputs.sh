#!/usr/bin/env bash
# The outputs device command (issue 15): on the GPU host, once every ortgpu.part but the last is in /tmp/ortparts,
#   bash bench/gpu/outputs.sh     (carry: the last .whl/ortgpu.part.NN, .whl/gpu-env.sh, .whl/ortgpu.sha256,
#                                  .whl/ortgpu.name, .whl/small)
# installs onnxruntime-gpu, then runs the device tests of log-probabilities (computed on the device,
# only top-N values to the host), presence/frequency penalties on the device, copied sessions (n
# samples), and the CUDA graph tests beside them (choosing and copying must not disturb replays).
set -o pipefail
. bench/gpu/prepare.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$OUT/gpu-info.txt"
timeout "${TEST_TIMEOUT:-400}" python3 -m pytest -m gpu -q -p no:cacheprovider -rA \
  tests/engine/test_cuda_outputs.py tests/engine/test_cuda_graphs.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -15
grep -c "cuda_unavailable_falling_back_to_cpu" "$OUT/gpu-tests.log" && echo "WARNING: a test fell back to CPU"
exit 0
