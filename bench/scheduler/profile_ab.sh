#!/usr/bin/env bash
# Issue #42's CPU proxy: where the engine worker's thread spends its samples with ~1,200 requests
# queued (tiny generated model, 64 slots, 1,200 requests at 400 req/s, 16-token prompts, 200 new
# tokens), the tree under test against a baseline tree, alternated.
#
#   BASE=/tmp/base OUT=bench/results/scheduler-queue-YYYY-MM-DD ROUNDS=2 bash bench/scheduler/profile_ab.sh
#
# BASE: a checkout of the baseline commit (git worktree add /tmp/base <commit>). Each run writes
# the sweep JSON and a py-spy raw profile (15 s over the GIL holder); bench/worker_profile.py
# splits the worker's samples into engine step, jobs and scheduler bookkeeping.
# FRONTENDS (default 0, the CPU default): gRPC in the server's process. With one frontend process on
# this 2-core VM the frontend bounds the run since the token-level cut (it writes every response):
# ~14 rows a step, the queue in front of the frontend, not at the scheduler (2026-12-05).
# py-spy pauses the server for each sample: with --nonblocking it reads a resumed generator's
# frames without their caller, and those job-body samples counted for no thread.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${BASE:?a baseline checkout}" "${OUT:?an output folder}"
ROUNDS=${ROUNDS:-2}
PY=${PY:-.venv/bin/python}
SPY=${SPY:-.venv/bin/py-spy}
MODEL=$($PY -c "from pathlib import Path; from engine.modelgen.synthetic import build_synthetic, TINY
print(build_synthetic(TINY, Path('/tmp/tinymodels'), context_length=1024))")
mkdir -p "$OUT"
for round in $(seq 1 "$ROUNDS"); do
  for tree in base head; do
    root=$([ "$tree" = base ] && echo "--server-root $BASE" || echo "")
    $PY -m bench.serving --provider cpu --precision fp32 --model "$MODEL" --capacity 1024 \
      --max-sessions 64 --rates 400 --requests 1200 --prompt-len 16 --output-len 200 \
      --server-args "--frontends ${FRONTENDS:-0}" $root \
      --attach "$SPY record --pid {pid} --duration 15 --rate 200 --format raw --gil --output $OUT/py-spy-$tree-$round.txt" \
      --out "$OUT/$tree-$round" > "$OUT/$tree-$round.log" 2>&1
  done
done
$PY -m bench.worker_profile "$OUT"/py-spy-*.txt > "$OUT/worker-shares.json"
