"""The floor under Ladder's client-side TTFT overhead: the first event of a bare grpc.aio stream.

A server process with one GenerateStream that yields a token event at once (no engine, no
interceptor), and the same sync Python client the benchmarks use, one request after another:
what gRPC Python alone costs on this machine between a request sent and its first event
received. Compare with a benchmark's client TTFT minus the server's own `timing.ttft_ms`.

    python -m bench.grpc_floor [--requests 300] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from bench.served import machine
from proto.ladder.v1 import ladder_pb2 as pb
from proto.ladder.v1 import ladder_pb2_grpc as pb_grpc


class Bare(pb_grpc.LadderServicer):
    async def GenerateStream(self, request: pb.GenerateRequest, context: Any) -> AsyncIterator[pb.TokenEvent]:
        yield pb.TokenEvent(token=pb.Token(id=5))
        yield pb.TokenEvent(done=pb.Completion())


def serve(ports: Any) -> None:
    async def main() -> None:
        server = grpc.aio.server()
        pb_grpc.add_LadderServicer_to_server(Bare(), server)
        ports.put(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        await server.wait_for_termination()

    asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    ports: Any = mp.Queue()
    server = mp.Process(target=serve, args=(ports,), daemon=True)
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{ports.get(timeout=30)}")
    grpc.channel_ready_future(channel).result(timeout=30)
    stub = pb_grpc.LadderStub(channel)
    first = []
    for _ in range(args.requests):
        start = time.perf_counter()
        for event in stub.GenerateStream(pb.GenerateRequest()):
            if event.HasField("token"):
                first.append((time.perf_counter() - start) * 1e3)
    server.terminate()
    kept = sorted(first[args.requests // 6:])  # the first sixth warms up
    result = {"machine": machine(), "requests": len(kept), "first_event_ms_median": statistics.median(kept),
              "first_event_ms_p10": kept[len(kept) // 10], "first_event_ms_p90": kept[len(kept) * 9 // 10],
              "grpc": grpc.__version__}
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "grpc-floor.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
