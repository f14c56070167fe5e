#!/usr/bin/env bash
# Sampled against greedy decoding on the H200 (issue 40): on the GPU host, once every ortgpu.part but the last is
# in /tmp/ortparts,
#   bash bench/gpu/sampled.sh   (carry: the last .whl/ortgpu.part.NN, the genai wheel, .whl/gpu-env.sh,
#                                .whl/ortgpu.sha256, .whl/ortgpu.name, .whl/small)
# 1. the gpu tests of the sampling kernel and the engine's sampled decode (TESTS to change them);
# 2. unless SKIP_CLOSED: closed loop through the service, greedy and temperature 0.8 + top_p 0.95 (seeded) rounds
#    alternating on one server (bench/sampled.py), on MODEL (16x2048 by default; 8b), STREAMS;
# 3. unless SKIP_OPEN: the open-loop sweep at RATES, greedy then sampled (temperature 0.7, top_p 0.9),
#    one fresh server each, the same requests (one seed).
set -o pipefail
. bench/gpu/prepare.sh || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$OUT/gpu-info.txt"
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -m gpu -q -p no:cacheprovider -p no:randomly \
    ${TESTS:-tests/engine/test_sampled_rows.py tests/engine/test_cuda_graphs.py tests/engine/test_greedy_rows.py} \
    > "$OUT/gpu-tests.log" 2>&1
  echo "gpu tests exit $?"; tail -4 "$OUT/gpu-tests.log"
fi
model=${MODEL:-16x2048}
[ -z "${SKIP_CLOSED:-}" ] && timeout "${BENCH_TIMEOUT:-300}" python3 -m bench.sampled --provider cuda --model "gpu:$model" --precision fp16 \
  --streams "${STREAMS:-1,16,64}" --prompt 256 --new "${NEW:-128}" --calls "${CALLS:-2}" --rounds "${ROUNDS:-3}" \
  --out "$OUT/closed-$model" > "$OUT/closed-$model.log" 2>&1
[ -z "${SKIP_CLOSED:-}" ] && { echo "closed loop $model exit"; grep '"ratio"' "$OUT/closed-$model.log"; }
[ -n "${SKIP_OPEN:-}" ] && exit 0
for kind in greedy sampled; do
  temp=$([ "$kind" = sampled ] && echo 0.7 || echo 0)
  timeout "${RUN_TIMEOUT:-150}" python3 -m bench.serving --provider cuda --model "gpu:$model" --precision fp16 \
    --max-sessions "${SLOTS:-128}" --rates "${RATES:-24,36,44}" --requests "${REQUESTS:-400}" \
    --client-procs "${PROCS:-4}" --temperature "$temp" --top-p 0.9 --out "$OUT/open-$kind" \
    > "$OUT/open-$kind.log" 2>&1
  echo "open loop $kind exit $?"
done
python3 -m bench.serving_table "$OUT"
