#!/usr/bin/env bash
# Issue 28's decode figures on the H200, one model per call (an 8B-class run takes minutes):
#   MODELS="8b" bash bench/gpu/floors.sh     (carry as bench/gpu/batching.sh; models: bench/gpu/run.py
#                                            SPECS with -packed / -int4, e.g. "16x2048 16x2048-int4 8b 8b-int4")
# For each: the service's steady decode at 1, 16 and 64 streams, the engine's single stream, onnxruntime's
# raw graph replay at B = 1/16/64 and the step's memory-bandwidth floor (bench/batching.py, floors).
set -o pipefail
. bench/gpu/prepare.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$OUT/gpu-info.txt"
for model in ${MODELS:-16x2048}; do
  mkdir -p "$OUT/$model"
  timeout "${BENCH_TIMEOUT:-540}" python3 -m bench.batching --provider cuda --model "gpu:$model" --precision fp16 \
    --streams 1,16,64 --skip load,soak,numerics --out "$OUT/$model" ${BENCH_ARGS:-} > "$OUT/$model/batching.log" 2>&1
  echo "$model: bench exit $?"
  python3 - "$OUT/$model/batching.json" <<'PY' || tail -c 3000 "$OUT/$model/batching.log"
import json, sys
r = json.load(open(sys.argv[1]))
raw, floor = r.get("raw_replay", {}), r.get("floors", {}).get("stated", {})
for b in ("1", "16", "64"):
    served = r.get("scaling", {}).get(b, {}).get("steady_tok_s")
    print(f"B={b}: served {served} tok/s, raw {raw.get(b, {}).get('tok_s')}, floor {floor.get(b, {}).get('ceiling_tok_s')}")
print("engine single stream", r.get("engine_single_stream"))
PY
  [ -n "${KEEP_MODELS:-}" ] || rm -rf /tmp/ladder-gpu-models  # 64 GiB of disk: one model at a time
done
