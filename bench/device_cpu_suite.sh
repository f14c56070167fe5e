#!/usr/bin/env bash
# The CPU tests on the device's host (a Xeon with AVX-512/AMX: onnxruntime's MLAS picks other kernels
# there than on an AVX2-only EPYC), from the repo root, once the wheels and the default model's GGUF
# have been carried into /tmp/w in parts (.whl/devA-D: `split -b 33M` of the GGUF as gguf.part.NN).
# Writes the CPU's flags, the engine's measured kernel rules and each pytest run's output under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" .pytest_cache/d/ladder-default-model/downloads
cat /tmp/w/gguf.part.* > .pytest_cache/d/ladder-default-model/downloads/SmolLM2-135M-Instruct.Q4_1.gguf
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site /tmp/w/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
{ lscpu | grep -E 'Model name|^CPU\(s\)'; lscpu | grep -o 'avx512[a-z_]*\|amx[a-z_]*' | sort -u | tr '\n' ' '; echo; } > "$OUT/cpu.txt"
python3 -c 'import onnxruntime as o; print("onnxruntime", o.__version__, o.get_available_providers())' >> "$OUT/cpu.txt"
cat "$OUT/cpu.txt"
for part in "$@"; do
  name=$(echo "$part" | tr '/ ' '__')
  timeout 480 python3 -m pytest -q -n 8 --dist loadfile -m "not gpu" -p no:randomly $part > "$OUT/pytest-$name.txt" 2>&1
  echo "$part: rc=$?"; tail -3 "$OUT/pytest-$name.txt"
done
python3 -c "
from engine.executor import EngineOptions
from engine.executor.engine import Engine
e = Engine.load('.pytest_cache/d/ladder-default-model/models/smollm2-135m-instruct-int4-ctx4096',
                EngineOptions(max_sessions=4, capacity=1024))
print(e.kernels, e.batch_widths)" 2>&1 | grep -v '^20' | tee "$OUT/kernel_rules.txt"
