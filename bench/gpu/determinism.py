"""Does a served full prefill give the same greedy tokens run after run? The system-prompt requests of
`bench/prefix.py` (a 2,000-token system prompt + 100-token turns, 8 new tokens each, after one warm-up
request) sent to a fresh server with prefix sharing off, `--repeats` times for each setting of the
decode lookahead, on the 3B-class decoder; reports which requests' tokens differ between runs.

    python -m bench.gpu.determinism --out $OUT
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.prefix import stream
from bench.served import free_port, machine, prompt, resolve_model, server_arguments, stub, wait_serving


def run(args: argparse.Namespace, model: str, lookahead: bool, log: Path) -> list[list[int]]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "service",
        "--model",
        model,
        "--provider",
        args.provider,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--metrics-port",
        "0",
        "--max-sessions",
        "8",
        "--capacity",
        "8192",
        "--max-new-tokens",
        "64",
        "--chunk-size",
        "512",
        "--prefix-sharing",
        "false",
        "--lookahead",
        "true" if lookahead else "false",
    ]
    with open(log, "ab") as out:
        server = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_serving(f"127.0.0.1:{port}")
        client = stub(f"127.0.0.1:{port}")
        system = prompt(2000, 1, 32000)
        stream(client, system + prompt(100, 99, 32000), 2)
        return [stream(client, system + prompt(100, 100 + i, 32000), 8)["ids"] for i in range(args.requests)]
    finally:
        server.terminate()
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    server_arguments(parser, "cuda", "gpu:28x3072", "fp32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests", type=int, default=10)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = resolve_model(args)
    result: dict[str, Any] = {"machine": machine(), "model": args.model}
    for lookahead in (True, False):
        runs = [run(args, model, lookahead, args.out / "server.log") for _ in range(args.repeats)]
        differing = [i for i in range(args.requests) if any(r[i] != runs[0][i] for r in runs)]
        result[f"lookahead_{'on' if lookahead else 'off'}"] = {
            "requests_differing_between_runs": differing,
            "tokens_of_differing": {str(i): [r[i] for r in runs] for i in differing},
        }
        print(lookahead, differing, flush=True)
    print(json.dumps(result, indent=2))
    (args.out / "determinism.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
