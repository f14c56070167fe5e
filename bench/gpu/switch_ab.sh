#!/usr/bin/env bash
# The interpreter's switch interval side by side (issue 28): the server is one process whose event
# loop (gRPC) and engine worker share the GIL; after each forward the worker may wait up to the
# switch interval for it. On the GPU host, once ortgpu.part.00-03 are in /tmp/ortparts,
#   bash bench/gpu/switch_ab.sh   (carry: as chain_ab.sh)
# ROUNDS times, for each interval in INTERVALS (ms, 0 = Python's 5 ms): a fresh server on the 16x2048
# fp16 decoder, 128 slots, the client over 4 processes, Poisson at RATES (one below saturation, one
# past it), REQUESTS per rate. Summaries in $OUT/sw-<ms>-<round>/sweep-grpc.json, a table at the end.
set -o pipefail
. bench/gpu/prepare.sh || exit 1
for round in $(seq 1 "${ROUNDS:-2}"); do
  for ms in ${INTERVALS:-0 1 0.2}; do
    timeout "${RUN_TIMEOUT:-150}" python3 -m bench.serving --provider cuda --model gpu:16x2048 --precision fp16 \
      --max-sessions 128 --rates "${RATES:-36,96}" --requests "${REQUESTS:-500}" --client-procs 4 \
      --server-args "--switch-interval-ms $ms" --out "$OUT/sw-$ms-$round" > "$OUT/sw-$ms-$round.log" 2>&1
    echo "round $round interval $ms exit $?"
  done
done
rm -f "$OUT"/sw-*/sweep-grpc.svg
python3 -m bench.serving_table "$OUT" | tee "$OUT/table.md"
