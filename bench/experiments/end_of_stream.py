"""What a gRPC aio server sees when a client-streaming request ends: a half-close, a cancel, or a
killed client. For each, a real client subprocess sends one message and then half-closes, cancels
(after 0.3 s) or dies (os._exit after 0.3 s); the handler reports what reading the next message
gave, whether the context says cancelled, and how long after that the call's cancellation arrived.

    python -m bench.experiments.end_of_stream            # prints one line per ending
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import grpc
from grpc import aio

CLIENT = r"""
import grpc, os, sys, threading, time
mode = sys.argv[2]
call_box = []
def requests():
    yield b"x"
    if mode == "half-close":
        return
    time.sleep(0.3)
    if mode == "kill":
        os._exit(1)
    time.sleep(10)
call = grpc.insecure_channel(sys.argv[1]).stream_stream("/t.T/S")(requests())
if mode == "cancel":
    threading.Timer(0.3, call.cancel).start()
try:
    for _ in call:
        pass
except grpc.RpcError:
    pass
"""


async def handler(request_iterator: Any, context: Any) -> Any:
    messages = aiter(request_iterator)
    await anext(messages, None)
    after = await anext(messages, None)
    ended, seen = time.perf_counter(), context.cancelled()
    try:
        await asyncio.sleep(1.0)
        print(f"next read: {after!r}; cancelled() then: {seen}; no cancellation within 1 s", flush=True)
    except asyncio.CancelledError:
        print(
            f"next read: {after!r}; cancelled() then: {seen}; cancelled "
            f"{(time.perf_counter() - ended) * 1e3:.2f} ms later",
            flush=True,
        )
        raise
    yield b"done"


async def main() -> None:
    server = aio.server()
    methods = {"S": grpc.stream_stream_rpc_method_handler(handler)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.T", methods),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    for mode in ("half-close", "kill", "kill", "kill", "cancel", "cancel"):
        print(f"{mode}: ", end="", flush=True)
        client = await asyncio.create_subprocess_exec(sys.executable, "-c", CLIENT, f"127.0.0.1:{port}", mode)
        await client.wait()
        await asyncio.sleep(1.2)
    await server.stop(None)


if __name__ == "__main__":
    asyncio.run(main())
