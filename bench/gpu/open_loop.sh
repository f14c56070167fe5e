#!/usr/bin/env bash
# Open loop on the 16x2048 fp16 decoder past saturation, and where the server's time goes (issue 28):
# on the GPU host, once every ortgpu.part but the last is in /tmp/ortparts,
#   bash bench/gpu/open_loop.sh   (carry: as chain_ab.sh, plus .whl/pyspy with py-spy's wheel)
# 1. rate 48 with the client in one process, then rates 64,96,128 with it split over 4 (client_cores
#    says whether one process was the limit); 2. rate 64 with py-spy attached to the server
#    (--threads, every active thread; then --gil, the thread holding the GIL), 20 s each.
set -o pipefail
. bench/gpu/prepare.sh || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/pyspy .whl/pyspy/*.whl || exit 1
run() {
  name=$1; shift
  timeout "${RUN_TIMEOUT:-200}" python3 -m bench.serving --provider cuda --model gpu:16x2048 --precision fp16 \
    --max-sessions "${SLOTS:-128}" "$@" --out "$OUT/$name" > "$OUT/$name.log" 2>&1
  echo "$name exit $?"
}
spy="/tmp/pyspy/bin/py-spy record --pid {pid} -r 250 -d 20 -f raw"  # whole stacks: see bench/worker_profile.py
[ -n "${SKIP_SWEEP:-}" ] || {
  run procs1 --rates 48 --requests 300 --client-procs 1
  run procs4 --rates 48,64,96,128 --requests 400 --client-procs 4
}
run spy-threads --rates 64 --requests 1400 --client-procs 4 --attach "$spy --threads -o $OUT/spy-threads.txt"
run spy-gil --rates 64 --requests 1400 --client-procs 4 --attach "$spy --threads --gil -o $OUT/spy-gil.txt"
python3 -m bench.serving_table "$OUT"
