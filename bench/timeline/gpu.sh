#!/usr/bin/env bash
# The timeline device command (bench/timeline/probe.py says what it measures): on the GPU host, once
# ortgpu.part.00-03 are in /tmp/ortparts, `bash bench/timeline/gpu.sh` (carry as bench/gpu/prefix.sh).
# Runs the CUDA tests, the prefix benchmark on the 3B-class decoder, gRPC's own floor, then probes a
# request with sharing on and off from the server's debug log (no change to the tree).
set -o pipefail
. bench/gpu/prepare.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$OUT/gpu-info.txt"
(git log --oneline -1 2>/dev/null || echo no-git) > $OUT/commit.txt
timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider tests/engine/test_cuda_graphs.py tests/engine/test_cuda_prefix.py tests/engine/test_cuda_outputs.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -3
python3 -m bench.experiments.grpc_floor --out "$OUT" > /dev/null 2>&1 || echo "grpc floor failed"
timeout 300 python3 -m bench.prefix --provider cuda --model gpu:28x3072 --capacity 8192 --slots 8 --chunk-sizes 512 --requests 10 --forks 20 --out "$OUT" > "$OUT/prefix.log" 2>&1
echo "bench exit $?"; grep -A3 '"compare"' $OUT/prefix.log | head; grep -E "ratio|fork" $OUT/prefix.log | head -12
python3 -m bench.experiments.grpc_floor --cases --delay 0.04 --requests 120 --out "$OUT" > /dev/null 2>&1; grep -E "interceptor|ids|median" $OUT/grpc-floor-cases.json
for cfg in "on 0.04" "off 0.04 --prefix-sharing=false"; do
  set -- $cfg; name=probe-$1-$2; delay=$2; shift 2
  mkdir -p $OUT/$name
  timeout 150 python3 -m bench.timeline.probe --model gpu:28x3072 --provider cuda --precision fp32 --requests 12 --delay $delay --out $OUT/$name "--extra=$*" > $OUT/$name/probe.log 2>&1
  echo "== $name rc $?"
  python3 -m bench.timeline.merge $OUT/$name/client.jsonl $OUT/$name/server.log > $OUT/$name/stages.txt; cat $OUT/$name/stages.txt
  gzip -9 $OUT/$name/server.log  # raw: kept out of git
done
true
