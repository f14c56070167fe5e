#!/usr/bin/env bash
# The decode chain on and off side by side, open loop (issue 28): on the GPU host, once
# ortgpu.part.00-03 are in /tmp/ortparts,
#   bash bench/gpu/chain_ab.sh   (carry: .whl/ortgpu.part.04, the genai wheel, .whl/gpu-env.sh,
#                                 .whl/ortgpu.sha256, .whl/ortgpu.name, .whl/small)
# ROUNDS times, the same Poisson sweep on the 16x2048 fp16 decoder with --decode-chain true and false
# in turn (the same requests: one seed), each server started fresh. Every run's summary lands in $OUT/ab-<on|off>-<round>/sweep-grpc.json;
# the last lines print output tok/s, TTFT p99 and inter-token p50/p99 per rate, on beside off.
set -o pipefail
. bench/gpu/prepare.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$OUT/gpu-info.txt"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for chain in on off; do
    flag=$([ "$chain" = on ] && echo true || echo false)
    timeout "${RUN_TIMEOUT:-130}" python3 -m bench.serving --provider cuda --model gpu:16x2048 --precision fp16 \
      --max-sessions "${SLOTS:-128}" --rates "${RATES:-32,48}" --requests "${REQUESTS:-300}" \
      --server-args "--decode-chain $flag" --out "$OUT/ab-$chain-$round" > "$OUT/ab-$chain-$round.log" 2>&1
    echo "round $round chain $chain exit $?"
  done
done
python3 - "$OUT" <<'PY'
import json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob("ab-*/sweep-grpc.json")):
    for rate, r in json.loads(path.read_text())["loads"].items():
        print(path.parent.name, rate, round(r["output_tok_s"]), "ttft p99", round(r["ttft_ms"]["p99"], 1),
              "itl p50/p99", round(r["itl_ms"]["p50"], 2), round(r["itl_ms"]["p99"], 2))
PY
