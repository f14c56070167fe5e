# Sourced by every bench/gpu/*.sh device command, from the repo root on the GPU host, once
# ortgpu.part.00-03 are in /tmp/ortparts (part 04 travels with the command): installs onnxruntime-gpu
# (+ genai) and the service's small wheels into /tmp/site and puts the repo on the path.
cp .whl/ortgpu.part.04 /tmp/ortparts/ 2>/dev/null
. .whl/gpu-env.sh || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/small/*.whl || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1
