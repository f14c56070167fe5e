#!/usr/bin/env bash
# A server change side by side with the tree before it, open loop near saturation (issue 28; first for
# gc.freeze() at start-up). On the GPU host, once every ortgpu.part but the last is in /tmp/ortparts, with the
# baseline's tree in .whl/base (here: rm -rf .whl/base && mkdir -p .whl/base &&
# git archive <rev> service engine proto clients | tar -x -C .whl/base):
#   bash bench/gpu/gc_ab.sh   (carry: as chain_ab.sh, plus .whl/base)
# ROUNDS times this tree then the baseline, each a fresh server on the 16x2048 fp16 decoder, 128 slots,
# the client over 4 processes, Poisson at RATES, REQUESTS per rate; a table at the end.
set -o pipefail
. bench/gpu/prepare.sh || exit 1
for round in $(seq 1 "${ROUNDS:-2}"); do
  for tree in this base; do
    root=$([ "$tree" = base ] && echo "--server-root $PWD/.whl/base")
    timeout "${RUN_TIMEOUT:-150}" python3 -m bench.serving --provider cuda --model gpu:16x2048 --precision fp16 \
      --max-sessions 128 --rates "${RATES:-36,40}" --requests "${REQUESTS:-800}" --client-procs 4 $root \
      --out "$OUT/$tree-$round" > "$OUT/$tree-$round.log" 2>&1
    echo "round $round $tree exit $?"
  done
done
rm -f "$OUT"/*/sweep-grpc.svg
python3 -m bench.serving_table "$OUT" | tee "$OUT/table.md"
tar czf "$OUT/runs.tgz" -C "$OUT" this-1 base-1 this-2 base-2 2>/dev/null && rm -rf "$OUT"/this-* "$OUT"/base-*
