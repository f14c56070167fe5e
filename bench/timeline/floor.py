"""gRPC Python's own floor for a request's way in: a bare grpc.aio server (no engine), with and
without a pass-through interceptor, an empty request and one of 2,100 token ids, each request sent
after `delay` idle seconds (a benchmark that alternates two servers leaves each idle between its
requests). Prints, per case, the median from the client's send to the handler's start ("way in",
both on CLOCK_MONOTONIC) and to the client's first event.

    python -m bench.timeline.floor [DELAY]
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from proto.ladder.v1 import ladder_pb2 as pb
from proto.ladder.v1 import ladder_pb2_grpc as pb_grpc


class Bare(pb_grpc.LadderServicer):
    def __init__(self, arrivals: Any) -> None:
        self.arrivals = arrivals

    async def GenerateStream(self, request: pb.GenerateRequest, context: Any) -> AsyncIterator[pb.TokenEvent]:
        self.arrivals.put_nowait(time.perf_counter())
        yield pb.TokenEvent(token=pb.Token(id=5))
        yield pb.TokenEvent(done=pb.Completion())


class PassThrough(grpc.aio.ServerInterceptor):
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


def measure(intercept: bool, ids: int, requests: int, delay: float) -> None:
    ports, arrivals = mp.Queue(), mp.Queue()
    server = mp.Process(target=serve, args=(ports, arrivals, intercept), daemon=True)
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{ports.get(timeout=30)}")
    grpc.channel_ready_future(channel).result(timeout=30)
    stub = pb_grpc.LadderStub(channel)
    request = pb.GenerateRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=list(range(1000, 1000 + ids)))))
    way_in, first = [], []
    for _ in range(requests):
        time.sleep(delay)
        start = time.perf_counter()
        for event in stub.GenerateStream(request):
            if event.HasField("token"):
                first.append((time.perf_counter() - start) * 1e3)
        way_in.append((arrivals.get() - start) * 1e3)
    server.terminate()
    kept = requests // 6  # the first sixth warms up
    print(f"intercept={intercept} ids={ids} delay={delay}: way in {statistics.median(way_in[kept:]):.3f} ms, "
          f"first event {statistics.median(first[kept:]):.3f} ms", flush=True)


def main() -> None:
    delay = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
    for intercept in (False, True):
        for ids in (0, 2100):
            measure(intercept, ids, 120, delay)


if __name__ == "__main__":
    main()
