"""Sampled against greedy decoding through the real service (issue #40): N concurrent Generate calls
(closed loop: each stream sends its next call when its last one ends), each its own random prompt,
ignore_eos, greedy or temperature/top-p sampled with a seed per call; rounds of the two alternate
on one server, so the ratio is measured side by side.

    python -m bench.sampled --provider cpu --model default --precision int4 --streams 1,8 \
        --prompt 128 --new 64 --out bench/results/sampled-cpu-<date>
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import grpc

from bench.served import (
    free_port,
    machine,
    prompt,
    resolve_model,
    server_arguments,
    start_server,
    vocab_of,
    wait_serving,
)
from proto.ladder.v1 import ladder_pb2 as pb
from proto.ladder.v1 import ladder_pb2_grpc


def sampling(kind: str, temperature: float, top_p: float, seed: int) -> pb.SamplingOptions:
    if kind == "greedy":
        return pb.SamplingOptions()
    return pb.SamplingOptions(temperature=temperature, top_p=top_p, seed=seed)


async def round_of(
    address: str, kind: str, streams: int, calls: int, args: argparse.Namespace, vocab: int, offset: int
) -> dict[str, Any]:
    """`calls` calls per stream, `streams` at once: generated tok/s over the round."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = ladder_pb2_grpc.LadderStub(channel)

        async def stream(index: int) -> int:
            made = 0
            for k in range(calls):
                seed = offset + index * calls + k
                request = pb.GenerateRequest(
                    prompt=pb.Prompt(tokens=pb.TokenIds(ids=prompt(args.prompt, seed, vocab))),
                    sampling=sampling(kind, args.temperature, args.top_p, seed),
                    stopping=pb.StoppingOptions(max_new_tokens=args.new, ignore_eos=True),
                )
                reply = await stub.Generate(request, timeout=600)
                made += len(reply.token_ids)
            return made

        started = time.perf_counter()
        made = sum(await asyncio.gather(*(stream(i) for i in range(streams))))
        seconds = time.perf_counter() - started
    return {"kind": kind, "streams": streams, "tokens": made, "seconds": seconds, "tok_s": made / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    server_arguments(parser, "cpu", "default", "int4")
    parser.add_argument("--streams", default="1,8")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--calls", type=int, default=2, help="calls per stream and round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of each kind")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--server-args", default="", help="more flags for the server")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = resolve_model(args)
    vocab = vocab_of(model)
    widths = [int(s) for s in args.streams.split(",")]
    port = free_port()
    server = start_server(args, model, port, "--max-sessions", str(max(widths)), *args.server_args.split())
    address = f"127.0.0.1:{port}"
    rows: list[dict[str, Any]] = []
    try:
        wait_serving(address)
        asyncio.run(round_of(address, "sampled", max(widths), 1, args, vocab, 10**6))  # warm every width
        for streams in widths:
            for r in range(args.rounds):
                for kind in ("greedy", "sampled"):
                    row = asyncio.run(round_of(address, kind, streams, args.calls, args, vocab, r * 10**4))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        server.terminate()
        server.wait(timeout=60)
    summary = []
    for streams in widths:
        median = {
            kind: statistics.median(r["tok_s"] for r in rows if r["kind"] == kind and r["streams"] == streams)
            for kind in ("greedy", "sampled")
        }
        summary.append(
            {
                "streams": streams,
                "greedy_tok_s": round(median["greedy"], 1),
                "sampled_tok_s": round(median["sampled"], 1),
                "ratio": round(median["sampled"] / median["greedy"], 3),
            }
        )
    result = {
        "machine": machine(),
        "args": {k: str(v) for k, v in vars(args).items()},
        "rounds": rows,
        "summary": summary,
    }
    (args.out / "sampled.json").write_text(json.dumps(result, indent=1))
    for line in summary:
        print(json.dumps(line))


if __name__ == "__main__":
    main()
