#!/usr/bin/env bash
# A/B, alternated: BASE (a worktree of dac1926, before a4f4182) and this tree, each a fresh server
# behind one frontend (the default model), probed by bench/experiments/fork_deadlines.py.
#   BASE=/tmp/base ROUNDS=4 bash bench/results/fork-deadlines-2026-12-06/ab.sh
set -u
HERE=$(cd "$(dirname "$0")/../../.." && pwd)
OUT=$HERE/bench/results/fork-deadlines-2026-12-06
PY=$HERE/.venv/bin/python
for round in $(seq "${ROUNDS:-4}"); do
  for tree in base head; do
    dir=$HERE; [ $tree = base ] && dir=$BASE
    (cd "$dir" && exec "$PY" -m service --model default --port 50071 --metrics-port 9464 --frontends 1 \
      > "/tmp/fork-deadlines-$tree-$round.log" 2>&1) &
    for _ in $(seq 120); do grep -q '"serving"' "/tmp/fork-deadlines-$tree-$round.log" && break; sleep 1; done
    (cd "$HERE" && "$PY" -m bench.experiments.fork_deadlines --address 127.0.0.1:50071 \
      --metrics http://127.0.0.1:9464/metrics --count 300 --out "$OUT/$tree-$round.json")
    pkill -f "service --model default --port 50071"; sleep 3
  done
done
