#!/usr/bin/env bash
# coalesce_tokens off and on side by side, open loop (issue 28): on the GPU host, once
# every ortgpu.part but the last is in /tmp/ortparts,
#   bash bench/gpu/coalesce_ab.sh   (carry: the last .whl/ortgpu.part.NN, the genai wheel, .whl/gpu-env.sh,
#                                    .whl/ortgpu.sha256, .whl/ortgpu.name, .whl/small)
# ROUNDS times, the same Poisson sweep (one seed: the same requests) on the 16x2048 fp16 decoder,
# the client asking for one token per message (off, at RATES_OFF) and for coalesced messages (on,
# at RATES_ON), each against a fresh server, the client split over PROCS processes. Summaries land in
# $OUT/co-<off|on>-<round>/sweep-grpc.json and, together, in $OUT/coalesce.tgz (the device returns
# few files); the table of every run prints last.
set -o pipefail
. bench/gpu/prepare.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$OUT/gpu-info.txt"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for mode in off on; do
    if [ "$mode" = on ]; then rates=${RATES_ON:-36,96}; flag=--coalesce; else rates=${RATES_OFF:-36,96}; flag=; fi
    timeout "${RUN_TIMEOUT:-150}" python3 -m bench.serving --provider cuda --model gpu:16x2048 --precision fp16 \
      --max-sessions "${SLOTS:-128}" --rates "$rates" --requests "${REQUESTS:-500}" \
      --client-procs "${PROCS:-4}" $flag --out "$OUT/co-$mode-$round" --server-log "$OUT/co-$mode-$round.server.log" \
      > "$OUT/co-$mode-$round.log" 2>&1
    echo "round $round coalesce $mode exit $?"
  done
done
(cd "$OUT" && tar -czf coalesce.tgz co-* gpu-info.txt && rm -rf co-*)
mkdir -p /tmp/co && tar -xzf "$OUT/coalesce.tgz" -C /tmp/co && python3 -m bench.serving_table /tmp/co
