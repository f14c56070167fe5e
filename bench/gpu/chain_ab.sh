#!/usr/bin/env bash
# The decode chain on and off side by side, open loop (issue 28): on the GPU host, once
# every ortgpu.part but the last is in /tmp/ortparts,
#   bash bench/gpu/chain_ab.sh   (carry: the last .whl/ortgpu.part.NN, the genai wheel, .whl/gpu-env.sh,
#                                 .whl/ortgpu.sha256, .whl/ortgpu.name, .whl/small)
# ROUNDS times, the same Poisson sweep on the 16x2048 fp16 decoder with --decode-chain true and false
# in turn (the same requests: one seed), each server started fresh, the client split over PROCS
# processes. Every run's summary lands in $OUT/ab-<on|off>-<round>/sweep-grpc.json; the last lines
# print, per run and rate, output tok/s, TTFT p99, inter-token p50/p99, the client's and the
# server's CPU cores, and the server's decode steps/s and mean rows per step.
set -o pipefail
. bench/gpu/prepare.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$OUT/gpu-info.txt"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for chain in on off; do
    flag=$([ "$chain" = on ] && echo true || echo false)
    timeout "${RUN_TIMEOUT:-130}" python3 -m bench.serving --provider cuda --model gpu:16x2048 --precision fp16 \
      --max-sessions "${SLOTS:-128}" --rates "${RATES:-32,48}" --requests "${REQUESTS:-300}" \
      --client-procs "${PROCS:-1}" --server-args "--decode-chain $flag" --out "$OUT/ab-$chain-$round" \
      > "$OUT/ab-$chain-$round.log" 2>&1
    echo "round $round chain $chain exit $?"
  done
done
python3 -m bench.serving_table "$OUT"
