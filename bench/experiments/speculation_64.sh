#!/usr/bin/env bash
# Issue #44's "64 streams unchanged": 64 streams with speculative decoding auto (on: the tiny fp32
# model's verification rows are its decode rows) against off, alternated, on this machine's CPU.
#
#   OUT=bench/results/speculation-64-streams-YYYY-MM-DD bash bench/experiments/speculation_64.sh
#
# The setup of bench/scheduler/profile_ab.sh without py-spy: the tiny generated model, 64 slots,
# 1,200 requests at 400 req/s (far past saturation), 16-token prompts, 200 new tokens, one frontend.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
: "${OUT:?an output folder}"
MODEL=$($PY -c "from pathlib import Path; from engine.modelgen.synthetic import build_synthetic, TINY
print(build_synthetic(TINY, Path('/tmp/tinymodels'), context_length=1024))")
mkdir -p "$OUT"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for mode in off auto; do
    $PY -m bench.serving --provider cpu --precision fp32 --model "$MODEL" --capacity 1024 \
      --max-sessions 64 --rates 400 --requests 1200 --prompt-len 16 --output-len 200 \
      --server-args "--frontends 1 --speculate $mode" --out "$OUT/$mode-$round" > "$OUT/$mode-$round.log" 2>&1
  done
done
