"""A gRPC frontend process (`--frontends N`, service/relay.py): serves the gRPC port, relays every call.

Started by the core process with the relay socket's path and its index; told its settings over the
socket (address, TLS material, message and connection limits, log level, the methods to relay); raises
its own open-file limit (service/limits.py). It binds the port with SO_REUSEPORT, answers reflection
itself and relays every other call as raw bytes: no message is parsed here. Signals are the core's to
act on (it drains, then tells the frontends to stop); when the core's end of the socket closes, calls
in flight end with UNAVAILABLE and the process exits.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health
from grpc_reflection.v1alpha import reflection

from proto.ladder.v1 import ladder_pb2
from service import relay
from service.interceptors.auth import credentials
from service.limits import raise_file_limit
from service.logs import configure_logging
from service.ports import ConnectionLimits, server_options
from service.reflection import enable as documented_reflection
from service.relay import Link

log = structlog.get_logger("ladder.frontend")
GONE_GRACE_S = 0.5  # for calls in flight to send their UNAVAILABLE once the core has gone
GONE = (relay.END, 0, grpc.StatusCode.UNAVAILABLE.value[0], "the server's core process has gone; retry", ())


class _Call:
    def __init__(self, call: int) -> None:
        self.id = call
        self.answers: asyncio.Queue[tuple[Any, ...]] = asyncio.Queue()


class Relay(grpc.GenericRpcHandler):
    """Every method of `table` relayed over `link`, as raw bytes both ways."""

    def __init__(self, link: Link, table: Sequence[tuple[str, bool, bool]]) -> None:
        self.link = link
        self.calls: dict[int, _Call] = {}
        self._last = 0
        self.handlers = {name: self._handler(name, streams, answers) for name, streams, answers in table}

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        return self.handlers.get(handler_call_details.method)

    def _handler(self, method: str, streams: bool, answers: bool) -> Any:
        if streams and answers:

            async def stream_stream(requests: AsyncIterator[bytes], context: Any) -> Any:
                call = self._open(method, context, None)
                pump = asyncio.create_task(self._pump(call, requests))
                try:
                    async for message in self._answers(call, context):
                        yield message  # resumed once gRPC has written it: the core may go on
                        self.link.send((relay.DELIVERED, call.id))
                finally:
                    pump.cancel()

            return grpc.stream_stream_rpc_method_handler(stream_stream)
        if streams:
            return grpc.stream_unary_rpc_method_handler(self._unary_of(method, streams=True))
        if answers:

            async def unary_stream(request: bytes, context: Any) -> Any:
                async for message in self._answers(self._open(method, context, request), context):
                    yield message

            return grpc.unary_stream_rpc_method_handler(unary_stream)
        return grpc.unary_unary_rpc_method_handler(self._unary_of(method, streams=False))

    def _unary_of(self, method: str, streams: bool) -> Any:
        async def unary(request: Any, context: Any) -> bytes | None:
            call = self._open(method, context, None if streams else request)
            pump = asyncio.create_task(self._pump(call, request)) if streams else None
            answer = None
            try:
                async for message in self._answers(call, context):
                    answer = message
            finally:
                if pump is not None:
                    pump.cancel()
            return answer

        return unary

    def _open(self, method: str, context: Any, request: bytes | None) -> _Call:
        self._last += 1
        call = self.calls[self._last] = _Call(self._last)
        metadata = tuple((key, value) for key, value in context.invocation_metadata() or ())
        auth = {key: list(values) for key, values in (context.auth_context() or {}).items()}
        remaining, peer = context.time_remaining(), context.peer() or ""
        self.link.send((relay.START, call.id, method, metadata, remaining, peer, auth, request))
        context.add_done_callback(lambda ended: self._done(call, ended))
        return call

    def _done(self, call: _Call, context: Any) -> None:
        if self.calls.pop(call.id, None) is not None:
            self.link.send((relay.DONE, call.id, bool(context.cancelled())))

    async def _pump(self, call: _Call, requests: AsyncIterator[bytes]) -> None:
        """The client's request stream, message by message, then its end. gRPC ends it alike on
        half-close, cancel and disconnect; the handler tells them apart as under grpc.aio (headers)."""
        async for request in requests:
            self.link.send((relay.MESSAGE, call.id, request))
        self.link.send((relay.HALF_CLOSE, call.id))

    async def _answers(self, call: _Call, context: Any) -> AsyncIterator[bytes]:
        """The call's response messages as the core sends them; its headers, trailers and status set."""
        try:
            while True:
                item = await call.answers.get()
                kind = item[0]
                if kind == relay.MESSAGE:
                    yield item[2]
                elif kind == relay.INITIAL:
                    try:  # fails on a call that has ended: the handler's test of a client that left
                        await context.send_initial_metadata(item[2])
                        sent = True
                    except Exception:  # noqa: BLE001 — any failure to write: the headers did not go out
                        sent = False
                    self.link.send((relay.HEADERS, call.id, sent))
                else:
                    _, _, code, details, trailing = item
                    if trailing:
                        context.set_trailing_metadata(trailing)
                    if code:
                        await context.abort(relay.CODES[code], details, trailing)
                    return
        except asyncio.CancelledError:
            if call.id in self.calls:
                self.link.send((relay.CANCEL, call.id))
            raise

    async def serve(self, server: grpc.aio.Server) -> None:
        """Hand the core's items to their calls until it says stop, then stop the server within the
        grace it gives, still handing items on (what the core's calls send in that time is delivered);
        when the core goes away, calls in flight end UNAVAILABLE."""
        stop: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        reading = asyncio.create_task(self._read(stop))
        await server.stop(await stop)
        reading.cancel()

    async def _read(self, stop: asyncio.Future[float]) -> None:
        while (items := await self.link.receive()) is not None:
            for item in items:
                if item[0] == relay.STOP:
                    if not stop.done():
                        stop.set_result(float(item[1]))
                    continue
                call = self.calls.get(item[1])
                if call is not None:
                    call.answers.put_nowait(item)
        for call in self.calls.values():
            call.answers.put_nowait(GONE)
        if not stop.done():
            stop.set_result(GONE_GRACE_S)


async def run(path: str, index: int) -> int:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: None)  # the core drains, then says stop
    reader, writer = await asyncio.open_unix_connection(path)
    link = Link(reader, writer)
    link.send((relay.HELLO, index))
    items = await link.receive()
    if not items or items[0][0] != relay.SETTINGS:
        return 1
    _, settings, table = items[0]
    configure_logging(settings["log_level"])
    raise_file_limit()  # before the options: the connection cap's default is half of it
    relaying = Relay(link, table)
    limits = ConnectionLimits(**settings.get("connections", {}))
    server = grpc.aio.server(options=server_options(settings["max_message_bytes"], limits, share_port=True))
    server.add_generic_rpc_handlers((relaying,))
    names = (
        ladder_pb2.DESCRIPTOR.services_by_name["Ladder"].full_name,
        health.SERVICE_NAME,
        reflection.SERVICE_NAME,
    )
    documented_reflection(names, server)
    address = f"{settings['host']}:{settings['port']}"
    tls = credentials(settings["tls"])
    try:
        port = server.add_secure_port(address, tls) if tls else server.add_insecure_port(address)
    except RuntimeError as exc:
        link.send((relay.READY, 0, str(exc) or "bind failed"))
        link.close()
        return 1
    await server.start()
    link.send((relay.READY, port, ""))
    log.info("frontend_listening", index=index, port=port, pid=os.getpid())
    await relaying.serve(server)
    link.close()
    return 0


def main(argv: Sequence[str]) -> None:
    path, index = argv
    raise SystemExit(asyncio.run(run(path, int(index))))
