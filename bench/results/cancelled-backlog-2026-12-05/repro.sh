#!/usr/bin/env bash
# The CPU proxy overloaded through gRPC frontends, N times; prints each run's unserved requests.
#   MODEL=<tiny model dir> [FE=1] [PROCS=2] [RATE=600] [REQ=1800] [N=4] bash bench/results/cancelled-backlog-2026-12-05/repro.sh
# (<tiny>: `build_synthetic(TINY, Path('/tmp/tinymodels'), context_length=1024)`, as in
# bench/scheduler/profile_ab.sh.) GRPC_TRACE=op_failure,call_error makes gRPC log every call it
# cancels itself ("CancelWithError SVR") into the server's log.
set -o pipefail
OUTDIR=${OUTDIR:-/tmp/cancelled}
mkdir -p "$OUTDIR"
for i in $(seq 1 "${N:-4}"); do
  GRPC_VERBOSITY=debug GRPC_TRACE=op_failure,call_error timeout 300 python -m bench.serving --provider cpu \
    --precision fp32 --model "$MODEL" --capacity 1024 --max-sessions 64 --rates "${RATE:-600}" \
    --requests "${REQ:-1800}" --client-procs "${PROCS:-2}" --prompt-len 16 --output-len 200 \
    --server-args "--frontends ${FE:-1} --log-level info" --server-log "$OUTDIR/server-$i.log" \
    --out "$OUTDIR/run-$i" > "$OUTDIR/run-$i.log" 2>&1
  python -c "
import json, sys
for load in json.load(open(sys.argv[1]))['loads'].values():
    print($i, load['errors'], load['error_examples'][:3])" "$OUTDIR/run-$i/sweep-grpc.json"
  echo "  gRPC's own cancels in the server: $(grep -c 'CancelWithError SVR' "$OUTDIR/server-$i.log")"
done
