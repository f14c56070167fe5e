"""How late a stream's events reach the client after the engine made them: this version against an
earlier one, side by side, through the real service.

For each version a server (`python -m service`, from this checkout or from --baseline-root) runs
GenerateStream requests one at a time; for each request:
- TTFT lag: client TTFT minus the server's own `timing.ttft_ms` (the token's time on the worker);
- arrival gaps: the client's gaps between consecutive tokens, against the server's `inter_token_ms`.
Rounds alternate between the versions (A B A B ...) so both see the same machine load.

    python -m bench.experiments.delivery --model default --precision int4 \
        --cache .pytest_cache/d/ladder-default-model \
        --baseline-root /tmp/delivery-baseline --out bench/results/delivery-2026-11-30
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench import served
from bench.served import free_port, machine, prompt, resolve_model, server_arguments, stub, wait_serving
from proto.ladder.v1 import ladder_pb2 as pb


def start_server(args: argparse.Namespace, model: str, port: int, root: Path | None) -> Any:
    return served.start_server(
        args,
        model,
        port,
        "--max-sessions",
        "4",
        log=f"server-{'baseline' if root else 'this'}.log",
        root=root,
    )


def one_request(client: Any, tokens: list[int], new: int) -> dict[str, Any]:
    request = pb.GenerateRequest(
        prompt=pb.Prompt(tokens=pb.TokenIds(ids=tokens)),
        stopping=pb.StoppingOptions(max_new_tokens=new, ignore_eos=True),
    )
    start = time.perf_counter()
    arrivals: list[float] = []
    done = None
    for event in client.GenerateStream(request):
        if event.HasField("token"):
            arrivals.append(time.perf_counter())
        else:
            done = event.done
    assert done is not None and arrivals
    client_gaps = [(b - a) * 1e3 for a, b in zip(arrivals, arrivals[1:], strict=False)]
    return {
        "client_ttft_ms": (arrivals[0] - start) * 1e3,
        "server_ttft_ms": done.timing.ttft_ms,
        "client_gap_ms": statistics.median(client_gaps),
        "server_gap_ms": statistics.median(done.timing.inter_token_ms),
        "ids": [int(i) for i in done.token_ids],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    server_arguments(parser, provider="cpu", model="default", precision="int4")
    parser.add_argument("--baseline-root", type=Path, required=True)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=5)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = str(Path(resolve_model(args)).resolve())  # the baseline's server runs from its own root
    roots = {"this": None, "baseline": args.baseline_root.resolve()}
    servers, clients = {}, {}
    load_before = os.getloadavg()
    try:
        for name, root in roots.items():
            port = free_port()
            servers[name] = start_server(args, model, port, root)
            wait_serving(f"127.0.0.1:{port}")
            clients[name] = stub(f"127.0.0.1:{port}")
        vocab = clients["this"].GetModelInfo(pb.GetModelInfoRequest()).vocab_size
        rows: dict[str, list[dict[str, Any]]] = {name: [] for name in roots}
        for round_ in range(args.rounds + 1):  # round 0 warms both servers up and is dropped
            for name in roots:
                for i in range(args.requests):
                    row = one_request(clients[name], prompt(args.prompt, 1000 * round_ + i, vocab), args.new)
                    if round_:
                        rows[name].append(row)
    finally:
        for server in servers.values():
            server.terminate()
            server.wait(30)

    def summary(name: str) -> dict[str, float]:
        got = rows[name]
        median = statistics.median
        return {
            "client_ttft_ms": median(r["client_ttft_ms"] for r in got),
            "server_ttft_ms": median(r["server_ttft_ms"] for r in got),
            "ttft_lag_ms": median(r["client_ttft_ms"] - r["server_ttft_ms"] for r in got),
            "client_gap_ms": median(r["client_gap_ms"] for r in got),
            "server_gap_ms": median(r["server_gap_ms"] for r in got),
        }

    same = all(a["ids"] == b["ids"] for a, b in zip(rows["this"], rows["baseline"], strict=True))
    doc = {
        "machine": machine(),
        "command": "python -m bench.experiments.delivery " + " ".join(sys.argv[1:]),
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "greedy_tokens_equal": same,
        "this": summary("this"),
        "baseline": summary("baseline"),
    }
    (args.out / "delivery.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
