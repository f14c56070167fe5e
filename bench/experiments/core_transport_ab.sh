#!/usr/bin/env bash
# What the core's socket transport (--core-transport socket, service/core/core_link.py) costs against
# the direct core, side by side on one server build: the tiny generated model on CPU, 64 slots,
# 1,200 requests at 400 req/s (16-token prompts, 200 new tokens: saturated), alternated.
#
#   OUT=bench/results/token-level-core-YYYY-MM-DD/transport ROUNDS=2 bash bench/experiments/core_transport_ab.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:?an output folder}"
ROUNDS=${ROUNDS:-2}
PY=${PY:-.venv/bin/python}
MODEL=$($PY -c "from pathlib import Path; from engine.modelgen.synthetic import build_synthetic, TINY
print(build_synthetic(TINY, Path('/tmp/tinymodels'), context_length=1024))")
mkdir -p "$OUT"
for round in $(seq 1 "$ROUNDS"); do
  for transport in direct socket; do
    $PY -m bench.serving --provider cpu --precision fp32 --model "$MODEL" --capacity 1024 \
      --max-sessions 64 --rates 400 --requests 1200 --prompt-len 16 --output-len 200 \
      --server-args "--core-transport $transport" \
      --out "$OUT/$transport-$round" > "$OUT/$transport-$round.log" 2>&1
  done
done
