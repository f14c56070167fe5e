#!/usr/bin/env bash
# The scheduler before and after the slot queue (issue 42), side by side, open loop: on the GPU host,
# once every ortgpu.part but the last is in /tmp/ortparts,
#   bash bench/gpu/scheduler_ab.sh   (carry: the last .whl/ortgpu.part.NN, the genai wheel, .whl/gpu-env.sh,
#                                     .whl/ortgpu.sha256, .whl/ortgpu.name, .whl/small, .bench-baseline)
# .bench-baseline holds the baseline's engine/ service/ proto/ (`git archive <rev> engine service
# proto | tar -x -C .bench-baseline`). ROUNDS times, the baseline then this tree, the same Poisson
# sweep (one seed: the same requests) at RATES on the 16x2048 fp16 decoder with SLOTS slots and
# --frontends FRONTENDS, a fresh server each run, the client split over PROCS processes. Summaries
# and server logs land in $OUT/<base|head>-<round>/ and, together, in $OUT/scheduler.tgz; the
# table of every run prints last.
set -o pipefail
. bench/gpu/prepare.sh || exit 1
[ -d .bench-baseline/service ] || { echo "scheduler_ab.sh: no .bench-baseline/service"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$OUT/gpu-info.txt"
for round in $(seq 1 "${ROUNDS:-1}"); do
  for tree in base head; do
    root=(); [ "$tree" = base ] && root=(--server-root "$PWD/.bench-baseline")
    timeout "${RUN_TIMEOUT:-150}" python3 -m bench.serving --provider cuda --model gpu:16x2048 --precision fp16 \
      --max-sessions "${SLOTS:-128}" --rates "${RATES:-58,96}" --requests "${REQUESTS:-500}" \
      --client-procs "${PROCS:-4}" --server-args "--frontends ${FRONTENDS:-2}" "${root[@]}" \
      --out "$OUT/$tree-$round" --server-log "$OUT/$tree-$round.server.log" > "$OUT/$tree-$round.log" 2>&1
    echo "round $round $tree exit $?"
  done
done
(cd "$OUT" && tar -czf scheduler.tgz base-* head-* gpu-info.txt && rm -rf base-* head-*)
mkdir -p /tmp/sch && tar -xzf "$OUT/scheduler.tgz" -C /tmp/sch && python3 -m bench.serving_table /tmp/sch
