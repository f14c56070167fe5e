#!/usr/bin/env bash
# gRPC in the engine's process against gRPC frontend processes (--frontends, issue 28), side by side,
# open loop: on the GPU host, once every ortgpu.part but the last is in /tmp/ortparts,
#   bash bench/gpu/frontends_ab.sh   (carry: the last .whl/ortgpu.part.NN, the genai wheel, .whl/gpu-env.sh,
#                                     .whl/ortgpu.sha256, .whl/ortgpu.name, .whl/small)
# ROUNDS times, for each FRONTENDS value in MODES (0: gRPC in the engine's process), the same Poisson
# sweep (one seed: the same requests) at RATES on the 16x2048 fp16 decoder with SLOTS slots, a fresh
# server each run, the client split over PROCS processes. Summaries and server logs land in
# $OUT/fe-<frontends>-<round>/ and, together, in $OUT/frontends.tgz (the device returns few files);
# the table of every run prints last (server cores: all its processes; in brackets the engine's).
# A mode `base:N` runs the server from another tree with --frontends N: BASE_TGZ names a tarball of
# it carried along (e.g. `git archive 3773811 engine service proto pyproject.toml | gzip >
# .whl/base.tgz`, the byte relay before the token-level cut), unpacked into /tmp/base:
#   MODES="base:2 2" BASE_TGZ=.whl/base.tgz bash bench/gpu/frontends_ab.sh
# A mode may add server flags after commas: MODES="2 2,--decode-chain=off" (one flag A/B).
# PROTOCOL=http sends the same sweep as streamed /v1/completions (the client split over PROCS
# processes either way). PYSPY=1 records the core's process (the engine's, not its frontends) with
# py-spy over its GIL holder during each run's first rate, into $OUT/<run>/py-spy.txt (carry the
# py-spy wheel in .whl/small (py-spy pauses the process per sample: --nonblocking loses generator
# callers, bench/worker_profile.py): `pip download --no-deps --only-binary=:all: --platform
# manylinux2014_x86_64 -d .whl/small py-spy`).
set -o pipefail
. bench/gpu/prepare.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$OUT/gpu-info.txt"
if [ -n "${BASE_TGZ:-}" ]; then
  rm -rf /tmp/base && mkdir -p /tmp/base && tar -xzf "$BASE_TGZ" -C /tmp/base || exit 1
fi
declare -A seen
for round in $(seq 1 "${ROUNDS:-2}"); do
  for mode in ${MODES:-0 2}; do
    # A mode is [base:]N[,--flag=value...]: N frontends, the server's own tree or base's, and
    # further server flags (e.g. `2,--decode-chain=off`).
    head=${mode%%,*}
    extra=""
    [ "$head" != "$mode" ] && extra=" ${mode#*,}" && extra=${extra//,/ }
    frontends=${head#base:}
    root=()
    [ "$head" != "$frontends" ] && root=(--server-root /tmp/base)
    run="fe-${PROTOCOL:-grpc}-$(echo "$mode" | tr -cs 'a-z0-9' '-' | sed 's/-*$//')-$round"
    seen[$run]=$(( ${seen[$run]:-0} + 1 ))
    [ "${seen[$run]}" -gt 1 ] && run="$run-${seen[$run]}"  # the same mode twice in a round
    attach=()
    [ "${PYSPY:-0}" = 1 ] && mkdir -p "$OUT/$run" && attach=(--attach "/tmp/site/bin/py-spy record --pid {pid} \
--duration ${PYSPY_SECONDS:-12} --rate 200 --format raw --gil --output $OUT/$run/py-spy.txt")
    timeout "${RUN_TIMEOUT:-150}" python3 -m bench.serving --provider cuda --model gpu:16x2048 --precision fp16 \
      --max-sessions "${SLOTS:-128}" --rates "${RATES:-36,96}" --requests "${REQUESTS:-500}" \
      --client-procs "${PROCS:-4}" --protocol "${PROTOCOL:-grpc}" --server-args "--frontends $frontends$extra" "${root[@]}" --out "$OUT/$run" \
      --server-log "$OUT/$run.server.log" "${attach[@]}" > "$OUT/$run.log" 2>&1
    echo "round $round mode $mode exit $?"
  done
done
(cd "$OUT" && tar -czf frontends.tgz fe-* gpu-info.txt && rm -rf fe-*)
rm -rf /tmp/fe && mkdir -p /tmp/fe && tar -xzf "$OUT/frontends.tgz" -C /tmp/fe && python3 -m bench.serving_table /tmp/fe
