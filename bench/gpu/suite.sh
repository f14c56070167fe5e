#!/usr/bin/env bash
# Every GPU test, then the CPU suite's engine tests on the device host's processor (a Xeon with
# AVX-512/AMX, where onnxruntime picks other kernels than on an AVX2-only machine): on the GPU host,
# once every ortgpu.part but the last is in /tmp/ortparts,
#   bash bench/gpu/suite.sh    (carry: the last .whl/ortgpu.part.NN, the genai wheel, .whl/gpu-env.sh,
#                               .whl/ortgpu.sha256, .whl/ortgpu.name, .whl/small)
# Logs in $OUT/gpu-tests.log and $OUT/cpu-engine-tests.log. The host has no network: tests that
# need the default model's wheel from PyPI are deselected (-m "not network").
set -o pipefail
. bench/gpu/prepare.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$OUT/gpu-info.txt"
lscpu | grep -E "Model name|Flags" | sed 's/Flags:.*\(avx512f\).*/Flags: ... avx512f .../' | tee "$OUT/cpu-info.txt"
timeout "${GPU_TIMEOUT:-300}" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --continue-on-collection-errors tests/service/test_cuda_samples.py \
  tests/engine 2>&1 | tee "$OUT/gpu-tests.log" | tail -15
grep -c "cuda_unavailable_falling_back_to_cpu" "$OUT/gpu-tests.log" && echo "WARNING: a test fell back to CPU"
[ "${CPU:-1}" = 0 ] || timeout "${CPU_TIMEOUT:-200}" python3 -m pytest -m "not gpu and not network" -q -p no:cacheprovider -rfE --continue-on-collection-errors \
  -n "${WORKERS:-12}" tests/engine 2>&1 | tee "$OUT/cpu-engine-tests.log" | tail -15
exit 0
