# Sourced by every bench/gpu/*.sh device command, from the repo root on the GPU host, once
# the wheel's first parts are in /tmp/ortparts (the last travels with the command: however many parts
# the working tree's size leaves room for, see docs/architecture-cuda.md): installs onnxruntime-gpu
# (+ genai) and the service's small wheels into /tmp/site and puts the repo on the path.
mkdir -p /tmp/ortparts && cp .whl/ortgpu.part.* /tmp/ortparts/ 2>/dev/null
. .whl/gpu-env.sh || exit 1
# --upgrade: without it pip leaves /tmp/site/bin as the wheels above made it (no py-spy there).
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target /tmp/site .whl/small/*.whl || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
# Fail fast: without the wheel parts onnxruntime-gpu is not installed, and every bench would run on
# the CPU provider for minutes of device time (2026-12-02: a whole run was lost that way).
python3 -c 'import onnxruntime as o, sys; sys.exit("CUDAExecutionProvider" not in o.get_available_providers())' \
  || { echo "prepare.sh: onnxruntime has no CUDA provider (is every ortgpu.part but the last in /tmp/ortparts?)"; exit 1; }
