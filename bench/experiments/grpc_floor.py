"""The floor under Ladder's client-side TTFT overhead: the first event of a bare grpc.aio stream.

A server process with one GenerateStream that yields a token event at once (no engine, no
interceptor), and the same sync Python client the benchmarks use, one request after another:
what gRPC Python alone costs on this machine between a request sent and its first event
received. Compare with a benchmark's client TTFT minus the server's own `timing.ttft_ms`.

    python -m bench.experiments.grpc_floor [--requests 300] [--out DIR]

`--cases` runs four servers instead (without and with a pass-through interceptor, an empty
request and one of 2,100 token ids) and adds, per case, the median "way in": from the client's
send to the handler's start (both on CLOCK_MONOTONIC). `--delay S` idles S seconds before each
request, as a benchmark alternating two servers leaves each of them idle between its requests:

    python -m bench.experiments.grpc_floor --cases --delay 0.04 --requests 120
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from bench.served import machine
from proto.ladder.v1 import ladder_pb2 as pb
from proto.ladder.v1 import ladder_pb2_grpc as pb_grpc


class Bare(pb_grpc.LadderServicer):
    def __init__(self, arrivals: Any) -> None:
        self.arrivals = arrivals  # when each call reached the handler

    async def GenerateStream(self, request: pb.GenerateRequest, context: Any) -> AsyncIterator[pb.TokenEvent]:
        self.arrivals.put_nowait(time.perf_counter())
        yield pb.TokenEvent(token=pb.Token(id=5))
        yield pb.TokenEvent(done=pb.Completion())


class PassThrough(grpc.aio.ServerInterceptor):
    """An interceptor that wraps the stream handler as Ladder's does, and does nothing else."""

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]], details: Any) -> Any:
        handler = await continuation(details)
        inner = handler.unary_stream

        async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
            async for response in inner(request, context):
                yield response

        return handler._replace(unary_stream=stream)


def serve(ports: Any, arrivals: Any, intercept: bool) -> None:
    async def main() -> None:
        server = grpc.aio.server(interceptors=[PassThrough()] if intercept else None)
        pb_grpc.add_LadderServicer_to_server(Bare(arrivals), server)
        ports.put(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


def measure(requests: int, delay: float, intercept: bool = False, ids: int = 0) -> dict[str, Any]:
    """One server: each request's first event and way in, ms, the first sixth (warm-up) dropped."""
    ports, arrivals = mp.Queue(), mp.Queue()
    server = mp.Process(target=serve, args=(ports, arrivals, intercept), daemon=True)
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{ports.get(timeout=30)}")
    grpc.channel_ready_future(channel).result(timeout=30)
    stub = pb_grpc.LadderStub(channel)
    request = pb.GenerateRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=list(range(1000, 1000 + ids)))))
    first, way_in = [], []
    for _ in range(requests):
        time.sleep(delay)
        start = time.perf_counter()
        for event in stub.GenerateStream(request):
            if event.HasField("token"):
                first.append((time.perf_counter() - start) * 1e3)
        way_in.append((arrivals.get() - start) * 1e3)
    server.terminate()
    kept = sorted(first[requests // 6 :])
    return {
        "requests": len(kept),
        "first_event_ms_median": statistics.median(kept),
        "first_event_ms_p10": kept[len(kept) // 10],
        "first_event_ms_p90": kept[len(kept) * 9 // 10],
        "way_in_ms_median": statistics.median(way_in[requests // 6 :]),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--delay", type=float, default=0.0, help="idle seconds before each request")
    parser.add_argument("--cases", action="store_true", help="with/without an interceptor, 0/2,100 ids")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result: dict[str, Any] = {"machine": machine(), "grpc": grpc.__version__, "delay_s": args.delay}
    if args.cases:
        result["cases"] = [
            {"interceptor": intercept, "ids": ids, **measure(args.requests, args.delay, intercept, ids)}
            for intercept in (False, True)
            for ids in (0, 2100)
        ]
    else:
        result.update(measure(args.requests, args.delay))
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        name = "grpc-floor-cases.json" if args.cases else "grpc-floor.json"
        (args.out / name).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
