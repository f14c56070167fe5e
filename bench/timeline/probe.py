"""Where a shared-prefix request's time goes, stage by stage: one server, sequential GenerateStream calls.

Needs the timeline prints of `bench/timeline/instrument.patch` applied to the tree (they are not in
the service: each stage writes "T <stage> <perf_counter>" to the server's stderr). The client writes
"T client_send" / "T client_first" on the same clock (CLOCK_MONOTONIC is shared between processes);
`bench/timeline/merge.py` puts both logs in order and gives each stage's median gap.

    git apply bench/timeline/instrument.patch
    python -m bench.timeline.probe --model gpu:28x3072 --provider cuda --out DIR > DIR/client.log
    python -m bench.timeline.merge DIR/client.log DIR/server.log
    git checkout engine service
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from bench.served import free_port, prompt, resolve_model, stub, wait_serving
from proto.ladder.v1 import ladder_pb2 as pb


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="default")
    parser.add_argument("--provider", default="cpu")
    parser.add_argument("--precision", default="int4")
    parser.add_argument("--cache", default=".pytest_cache/d/ladder-default-model")
    parser.add_argument("--system", type=int, default=2000)
    parser.add_argument("--user", type=int, default=100)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--delay", type=float, default=0.04, help="idle seconds before each request")
    parser.add_argument("--new", type=int, default=2, help="tokens each request generates")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--extra", default="", help="more flags for the server")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = resolve_model(args)
    port = free_port()
    cmd = [sys.executable, "-m", "service", "--model", model, "--provider", args.provider,
           "--host", "127.0.0.1", "--model-precision", args.precision, "--capacity", "8192",
           "--max-new-tokens", "64",
           "--port", str(port), "--metrics-port", "0", *args.extra.split()]
    with open(args.out / "server.log", "wb") as log:
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_serving(f"127.0.0.1:{port}")
        client = stub(f"127.0.0.1:{port}")
        system = prompt(args.system, 1, 30000)
        for i in range(args.requests + 1):  # the first one warms up (merge.py drops it)
            ids = system + prompt(args.user, 100 + i, 30000)
            stopping = pb.StoppingOptions(max_new_tokens=args.new, ignore_eos=True)
            request = pb.GenerateRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=ids)), stopping=stopping)
            time.sleep(args.delay)
            sent, first, done = time.perf_counter(), None, None
            print("T client_send", sent, flush=True)
            for event in client.GenerateStream(request):
                if event.HasField("token") and first is None:
                    first = time.perf_counter()
                    print("T client_first", first, flush=True)
                elif event.HasField("done"):
                    done = event.done
            assert first is not None and done is not None
            print("R", done.timing.queue_ms, done.timing.ttft_ms, (first - sent) * 1e3, flush=True)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
