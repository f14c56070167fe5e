#!/usr/bin/env bash
# The token-level frontends (HEAD) against a baseline tree (BASE: the byte relay before the cut,
# 3773811), both with --frontends 1, at a rate below saturation: the same tokens served, so the
# cores each server takes (the core's process alone, and with its frontend) compare the work per
# token without the saturated loop's feedback (a 2-core VM: the client, the core's worker and the
# frontend share it). Tiny generated model on CPU, 64 slots, 16-token prompts, 200 new tokens.
#
#   BASE=/tmp/base OUT=bench/results/token-level-frontends-YYYY-MM-DD/rate-30 RATE=30 ROUNDS=2 \
#     bash bench/experiments/frontends_cut_ab.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${BASE:?a baseline checkout}" "${OUT:?an output folder}"
ROUNDS=${ROUNDS:-2}
RATE=${RATE:-30}
REQUESTS=${REQUESTS:-600}
PY=${PY:-.venv/bin/python}
MODEL=$($PY -c "from pathlib import Path; from engine.modelgen.synthetic import build_synthetic, TINY
print(build_synthetic(TINY, Path('/tmp/tinymodels'), context_length=1024))")
mkdir -p "$OUT"
for round in $(seq 1 "$ROUNDS"); do
  for tree in base head; do
    root=$([ "$tree" = base ] && echo "--server-root $BASE" || echo "")
    $PY -m bench.serving --provider cpu --precision fp32 --model "$MODEL" --capacity 1024 \
      --max-sessions 64 --rates "$RATE" --requests "$REQUESTS" --prompt-len 16 --output-len 200 \
      --server-args "--frontends 1" $root \
      --out "$OUT/$tree-$round" > "$OUT/$tree-$round.log" 2>&1
  done
done
