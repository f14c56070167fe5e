"""What the access log and the metrics cost: calls/s and tokens/s of the same load on two source trees.

Runs `python -m service` from each tree in turn (A, B, A, B, ...: interleaved rounds, so drift on a
shared machine hits both alike) on the same generated model, with the metrics endpoint on and the JSON
log written to a file at --log-level info, as a deployment runs it. Each round drives the server for
--seconds with --threads client threads making small unary Generate calls (the per-call cost is then
the largest share: an upper bound on the overhead) and one GenerateStream of --stream-tokens tokens
(the per-token cost). It scrapes /metrics once at the end, as Prometheus would.

    git archive main | tar -x -C /tmp/ladder-main
    python -m bench.experiments.operability --tree main=/tmp/ladder-main --tree branch=. \
        --out bench/results/operability-2026-11-30
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc

from bench.served import free_port, machine, request, stub, wait_serving


def load(address: str, seconds: float, threads: int, prompt_len: int, new: int) -> dict[str, float]:
    """`threads` threads making Generate calls back to back for `seconds`; calls/s and tokens/s."""
    counts = [0] * threads
    errors = [0] * threads
    until = time.perf_counter() + seconds

    def loop(index: int) -> None:
        ladder = stub(address)
        tokens = [3 + (index * 7 + i) % 200 for i in range(prompt_len)]
        while time.perf_counter() < until:
            try:
                ladder.Generate(request(tokens, new), timeout=30)
                counts[index] += 1
            except grpc.RpcError:
                errors[index] += 1

    started = time.perf_counter()
    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - started
    return {
        "calls_per_s": sum(counts) / elapsed,
        "tokens_per_s": sum(counts) * new / elapsed,
        "errors": float(sum(errors)),
    }


def stream(address: str, new: int) -> float:
    """Tokens/s of one GenerateStream of `new` tokens."""
    started = time.perf_counter()
    got = sum(
        1
        for e in stub(address).GenerateStream(request([5, 6, 7, 8], new), timeout=120)
        if e.HasField("token")
    )
    return got / (time.perf_counter() - started)


def one_round(tree: Path, model: Path, args: argparse.Namespace, log: Path) -> dict[str, Any]:
    port, metrics = free_port(), free_port()
    cmd = [
        sys.executable,
        "-m",
        "service",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--metrics-port",
        str(metrics),
        "--max-sessions",
        str(args.threads),
        "--log-level",
        args.log_level,
        "--max-new-tokens",
        str(max(args.new, args.stream_tokens)),
    ]
    with open(log, "ab") as out:  # `python -m` in the tree's root imports that tree's packages
        server = subprocess.Popen(cmd, cwd=tree, stdout=out, stderr=subprocess.STDOUT)
    try:
        address = f"127.0.0.1:{port}"
        wait_serving(address)
        load(address, 2.0, args.threads, args.prompt, args.new)  # warm the client and server paths
        result: dict[str, Any] = load(address, args.seconds, args.threads, args.prompt, args.new)
        streams = [stream(address, args.stream_tokens) for _ in range(3)]
        result["stream_tokens_per_s"] = statistics.median(streams)
        scraped = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10).read()
        result["metrics_bytes"] = len(scraped)
    finally:
        server.terminate()
        server.wait(timeout=60)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", action="append", required=True, help="name=path of a source tree")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new", type=int, default=4)
    parser.add_argument("--stream-tokens", type=int, default=256)
    parser.add_argument("--log-level", default="info", help="warning: no access lines (what the log costs)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    trees = dict(t.split("=", 1) for t in args.tree)
    from engine.convert.tokenizer_json import write_byte_level_tokenizer
    from engine.modelgen.synthetic import TINY, build_synthetic

    model = build_synthetic(TINY, Path(tempfile.mkdtemp()))
    write_byte_level_tokenizer(model, TINY.vocab_size)
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for index in range(args.rounds):
        for name, path in trees.items():
            result = one_round(Path(path).resolve(), model, args, args.out / f"server-{name}.log")
            rounds[name].append(result)
            print(json.dumps({"round": index, "tree": name, **result}), flush=True)
    summary = {
        name: {
            key: statistics.median(r[key] for r in results)
            for key in ("calls_per_s", "tokens_per_s", "stream_tokens_per_s", "errors")
        }
        for name, results in rounds.items()
    }
    names = list(trees)
    if len(names) == 2:
        a, b = (summary[n] for n in names)
        summary[f"{names[1]}/{names[0]}"] = {
            key: b[key] / a[key] for key in ("calls_per_s", "stream_tokens_per_s") if a[key]
        }
    report = {
        "machine": machine(),
        "command": " ".join(sys.argv),
        "args": vars(args) | {"out": str(args.out)},
        "rounds": rounds,
        "median": summary,
    }
    (args.out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
