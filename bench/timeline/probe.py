"""Where a shared-prefix request's time goes, stage by stage: one server, sequential GenerateStream calls.

Uses only what the server already reports: at `--log-level debug` one JSON line per forward
(`prefill_forward` / `decode_forward`, with its `ms` and request ids) and one access line per call
(`rpc`: `duration_ms`, `queue_ms`, `ttft_ms`), each stamped with the wall clock. Each request carries
its own `x-request-id` (probe-0 warms up), and the client writes one JSON line per request with its
send and first-event times on the same clock; `bench/timeline/merge.py` lines the two logs up.

    python -m bench.timeline.probe --model gpu:28x3072 --provider cuda --out DIR
    python -m bench.timeline.merge DIR/client.jsonl DIR/server.log
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.served import free_port, prompt, resolve_model, stub, wait_serving
from proto.ladder.v1 import ladder_pb2 as pb


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="default")
    parser.add_argument("--provider", default="cpu")
    parser.add_argument("--precision", default="int4")
    parser.add_argument("--cache", default=".pytest_cache/d/ladder-default-model")
    parser.add_argument("--system", type=int, default=2000)
    parser.add_argument("--user", type=int, default=100)
    parser.add_argument("--vocab", type=int, default=30000, help="prompt ids are drawn below it")
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--delay", type=float, default=0.04, help="idle seconds before each request")
    parser.add_argument("--new", type=int, default=2, help="tokens each request generates")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--extra", default="", help="more flags for the server")
    return parser.parse_args()


def send(client: Any, ids: list[int], new: int, request_id: str) -> dict[str, Any]:
    """One GenerateStream call: its wall-clock send and first-event times and the server's timing."""
    stopping = pb.StoppingOptions(max_new_tokens=new, ignore_eos=True)
    request = pb.GenerateRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=ids)), stopping=stopping)
    sent, first, done = time.time(), None, None
    for event in client.GenerateStream(request, metadata=[("x-request-id", request_id)]):
        if event.HasField("token") and first is None:
            first = time.time()
        elif event.HasField("done"):
            done = event.done
    assert first is not None and done is not None
    return {
        "request_id": request_id,
        "client_send": sent,
        "client_first": first,
        "queue_ms": done.timing.queue_ms,
        "ttft_ms": done.timing.ttft_ms,
    }


def main() -> None:
    args = arguments()
    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "service",
        "--model",
        resolve_model(args),
        "--provider",
        args.provider,
        "--host",
        "127.0.0.1",
        "--model-precision",
        args.precision,
        "--capacity",
        "8192",
        "--max-new-tokens",
        "64",
        "--log-level",
        "debug",
        "--port",
        str(port),
        "--metrics-port",
        "0",
        *args.extra.split(),
    ]
    with open(args.out / "server.log", "wb") as log:
        server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_serving(f"127.0.0.1:{port}")
        client = stub(f"127.0.0.1:{port}")
        system = prompt(args.system, 1, args.vocab)
        with open(args.out / "client.jsonl", "w") as out:
            for i in range(args.requests + 1):  # probe-0 warms up (merge.py drops it)
                time.sleep(args.delay)
                call = send(client, system + prompt(args.user, 100 + i, args.vocab), args.new, f"probe-{i}")
                print(json.dumps(call), file=out, flush=True)
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
