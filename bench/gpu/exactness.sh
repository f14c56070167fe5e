#!/usr/bin/env bash
# Is a request's greedy output independent of the load? On the GPU host, once every ortgpu.part but the last is in
# /tmp/ortparts:
#   bash bench/gpu/exactness.sh     (carry: the last .whl/ortgpu.part.NN, the genai wheel, .whl/gpu-env.sh,
#                                    .whl/ortgpu.sha256, .whl/ortgpu.name, .whl/small)
# installs onnxruntime-gpu, then bench/gpu/exactness.py on the 16x2048 fp16 decoder (and its int4 copy):
# --deterministic false and true side by side. summary.json and raw.json land under $OUT.
# With .whl/head carried (`git archive <rev> engine service proto bench` unpacked there) that tree is
# served and measured instead of the working tree (whose uncommitted edits then stay out of it):
#   mkdir -p .whl/head && git archive HEAD engine service proto bench | tar -x -C .whl/head
# About 5-6 minutes on the device (the 16x2048 build ~35 s, four servers' warm-up, the int4 copy);
# BENCH_ARGS="--int4 none" leaves the int4 part out.
set -o pipefail
. bench/gpu/prepare.sh
if [ -d .whl/head/engine ]; then cd .whl/head && export PYTHONPATH=/tmp/site:$PWD; fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | tee "$OUT/gpu-info.txt"
timeout "${BENCH_TIMEOUT:-540}" python3 -m bench.gpu.exactness --out "$OUT" ${BENCH_ARGS:-} > "$OUT/exactness.log" 2>&1
echo "bench exit $?"
grep -v '^ ' "$OUT/exactness.log" | tail -c 6000
