"""gRPC frontends in processes of their own: every call relayed to this process, which keeps the engine.

With `--frontends N` the gRPC port is served by N frontend processes (service/frontend.py) that
share it (SO_REUSEPORT: the kernel spreads connections over them). Each does gRPC's per-call and
per-message work (HTTP/2, framing, TLS, flow control) in an interpreter of its own and relays
every call, as raw bytes, over one Unix socket to this process, where the same handlers and
interceptors run as for a call gRPC hands over itself (`RelayContext` stands in for grpc.aio's
servicer context). Sessions, the scheduler and the engine stay here, so any frontend serves any
call. What crosses the socket per event-loop turn is one frame: every item made in that turn, so
the engine's step costs this process one write for all the streams it fed, not one gRPC message
each. Reflection is answered by the frontends themselves (it reads only descriptors); health goes
through the relay, so it says what this process says.

A frame is a length-prefixed `marshal` dump of a list of items (tuples, kind first): a private
format between processes of one installation, never exposed. Frontend to core: START (method,
metadata, time remaining, peer, auth context, the request when it is not a stream), MESSAGE,
HALF_CLOSE, CANCEL, DONE (the call ended at the frontend: delivered or cancelled), HEADERS (whether
the headers INITIAL asked for went out) and DELIVERED; core to frontend: INITIAL (response headers),
MESSAGE and END (status, details, trailers). As under grpc.aio, sending the headers is what fails on
a call that has already ended (the servicer's own test of a client that left), so INITIAL waits for
HEADERS. On a call with a request stream, each response message waits for DELIVERED (the frontend
wrote it to the client), as grpc.aio's handler resumes after its write: so Prefill keeps a session
only once "done" went through, and a client that cancelled as the stream ended does not leave one
behind. A frontend that exits takes the server down as an engine fault does (health NOT_SERVING,
drain, exit 1); when this process goes away its frontends end their calls with UNAVAILABLE and exit.

Here: the wire (`Link`), the stand-in context and the calls of one frontend's link (`Connection`).
Starting, watching and stopping the processes: service/frontends.py.
"""

from __future__ import annotations

import asyncio
import marshal
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import grpc
import structlog

log = structlog.get_logger("ladder.relay")

(START, MESSAGE, HALF_CLOSE, CANCEL, DONE, INITIAL, END, HELLO, SETTINGS, READY, STOP, HEADERS, DELIVERED) = (
    range(13)
)
_HEADER = struct.Struct("<I")
CODES = {code.value[0]: code for code in grpc.StatusCode}
Item = tuple[Any, ...]
if TYPE_CHECKING:  # types-grpcio's generics; grpc's classes take no parameters at run time
    Handler = grpc.RpcMethodHandler[Any, Any]


class Codec(Protocol):
    def dumps(self, value: Any, /) -> bytes: ...

    def loads(self, data: bytes, /) -> Any: ...


class Link:
    """One end of the relay socket. `send` queues an item; the items of one event-loop turn leave as
    one frame. `receive` gives the next frame's items (None once the other end has gone). Frames
    are `marshal` dumps (plain values); the core's orders (service/core_link.py) use `pickle`."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, codec: Codec = marshal
    ) -> None:
        self.reader, self.writer, self.codec = reader, writer, codec
        self._out: list[Item] = []
        self._loop = asyncio.get_running_loop()

    def send(self, item: Item) -> None:
        if not self._out:
            self._loop.call_soon(self.flush)
        self._out.append(item)

    def flush(self) -> None:
        items, self._out = self._out, []
        if items and not self.writer.is_closing():
            data = self.codec.dumps(items)
            self.writer.writelines((_HEADER.pack(len(data)), data))

    async def receive(self) -> list[Item] | None:
        try:
            header = await self.reader.readexactly(_HEADER.size)
            items: list[Item] = self.codec.loads(await self.reader.readexactly(_HEADER.unpack(header)[0]))
            return items
        except (asyncio.IncompleteReadError, ConnectionError):
            return None

    def close(self) -> None:
        self.flush()
        self.writer.close()


class Details(NamedTuple):
    """grpc.HandlerCallDetails as grpc.aio hands it to interceptors."""

    method: str
    invocation_metadata: tuple[tuple[str, str | bytes], ...]


class RelayContext:
    """What a handler and the interceptors see of a relayed call: grpc.aio's servicer context, as far
    as Ladder, health and the interceptors use it (metadata, peer, auth context, deadline, trailers,
    abort, response headers, write, done callbacks)."""

    def __init__(
        self,
        link: Link,
        call: int,
        metadata: tuple[tuple[str, str | bytes], ...],
        timeout: float | None,
        peer: str,
        auth: dict[str, list[bytes]],
    ) -> None:
        self._link, self._call = link, call
        self._metadata, self._peer, self._auth = metadata, peer, auth
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._trailing: tuple[tuple[str, str | bytes], ...] = ()
        self._code, self._details = grpc.StatusCode.OK, ""
        self._cancelled = self._ended = False
        self._headers: asyncio.Future[bool] | None = None
        self._delivery: asyncio.Future[None] | None = None
        self._callbacks: list[Callable[[Any], None]] = []
        self.serialize: Callable[[Any], bytes] | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self._metadata

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def cancelled(self) -> bool:
        return self._cancelled

    def done(self) -> bool:
        return self._ended

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        self._callbacks.append(callback)

    def set_trailing_metadata(self, metadata: Sequence[tuple[str, str | bytes]]) -> None:
        self._trailing = tuple((k, v) for k, v in metadata)

    async def abort(
        self,
        code: grpc.StatusCode,
        details: str = "",
        trailing_metadata: Sequence[tuple[str, str | bytes]] = (),
    ) -> None:
        if trailing_metadata:
            self.set_trailing_metadata(trailing_metadata)
        self._code, self._details = code, details
        raise grpc.aio.AbortError()

    async def send_initial_metadata(self, metadata: Sequence[tuple[str, str | bytes]]) -> None:
        """Send the response headers through the frontend; raises, as grpc.aio does, when they could
        not go out (the call has ended, or they were sent already)."""
        if self._cancelled or self._ended or self._headers is not None:
            raise RuntimeError("the call has ended or its headers were sent")
        self._headers = asyncio.get_running_loop().create_future()
        self._link.send((INITIAL, self._call, tuple((k, v) for k, v in metadata)))
        if not await self._headers:
            raise RuntimeError("the call has ended")

    def headers_sent(self, sent: bool) -> None:
        """The frontend says whether the headers went out."""
        if self._headers is not None and not self._headers.done():
            self._headers.set_result(sent)

    async def write(self, message: Any) -> None:
        if self._cancelled or self._ended:
            raise RuntimeError("the call has ended")
        self.answer(message)

    def answer(self, message: Any) -> None:
        self._link.send((MESSAGE, self._call, self.serialize(message) if self.serialize else message))

    async def answer_delivered(self, message: Any) -> None:
        """Send `message` and wait until the frontend has written it to the client."""
        self._delivery = asyncio.get_running_loop().create_future()
        self.answer(message)
        await self._delivery

    def delivered(self) -> None:
        if self._delivery is not None and not self._delivery.done():
            self._delivery.set_result(None)

    def end(self, code: grpc.StatusCode | None = None, details: str | None = None) -> None:
        """Send the call's status (the one set or aborted with, unless given) and trailers, once."""
        if not self._ended:
            self._ended = True
            code = self._code if code is None else code
            self._link.send(
                (
                    END,
                    self._call,
                    code.value[0],
                    self._details if details is None else details,
                    self._trailing,
                )
            )

    def cancel(self) -> None:
        """The call ended at the frontend before its handler did (cancelled, deadline, client gone)."""
        self._cancelled = True

    def finished(self, cancelled: bool) -> None:
        """The frontend says the call has ended there: its done callbacks run."""
        self._cancelled = self._cancelled or cancelled
        self._ended = True
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)


class _Relayed:
    """A call relayed from a frontend: its context, the task running its handler, its request stream."""

    def __init__(self, context: RelayContext) -> None:
        self.context = context
        self.requests: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None

    async def stream(self, parse: Callable[[bytes], Any]) -> AsyncIterator[Any]:
        while (data := await self.requests.get()) is not None:
            yield parse(data)


if TYPE_CHECKING:
    Resolve = Callable[[Details], Awaitable[Handler | None]]


class Connection:
    """One frontend's link: the calls it relays, each run as grpc.aio runs a call (a task of its own)."""

    def __init__(self, link: Link, resolve: Resolve) -> None:
        self.link, self.resolve = link, resolve
        self.calls: dict[int, _Relayed] = {}
        self.started = 0  # calls this frontend has relayed

    async def serve(self) -> None:
        try:
            while (items := await self.link.receive()) is not None:
                for item in items:
                    self._dispatch(item)
        finally:
            for relayed in list(self.calls.values()):
                self._cancel(relayed)
            self.calls.clear()

    def _dispatch(self, item: Item) -> None:
        kind, call = item[0], item[1]
        if kind == START:
            _, _, method, metadata, timeout, peer, auth, request = item
            self.started += 1
            context = RelayContext(self.link, call, metadata, timeout, peer, auth)
            started = self.calls[call] = _Relayed(context)
            started.task = asyncio.create_task(self._run(started, method, request))
            return
        relayed = self.calls.get(call)
        if relayed is None:
            return  # a call that has already ended here
        if kind == MESSAGE:
            relayed.requests.put_nowait(item[2])
        elif kind == HALF_CLOSE:
            relayed.requests.put_nowait(None)
        elif kind == CANCEL:
            self._cancel(relayed)
        elif kind == HEADERS:
            relayed.context.headers_sent(item[2])
        elif kind == DELIVERED:
            relayed.context.delivered()
        elif kind == DONE:
            del self.calls[call]
            if item[2] or not relayed.context.done():
                self._cancel(relayed)
            relayed.context.finished(item[2])

    @staticmethod
    def _cancel(relayed: _Relayed) -> None:
        """As grpc.aio does when a client cancels or its deadline passes: the handler's task is cancelled."""
        relayed.context.cancel()
        if relayed.task is not None and not relayed.task.done():
            relayed.task.cancel()

    async def _run(self, relayed: _Relayed, method: str, request: bytes | None) -> None:
        context = relayed.context
        try:
            handler = await self.resolve(Details(method, context.invocation_metadata()))
            if handler is None:
                context.end(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
                return
            context.serialize = handler.response_serializer
            parse: Callable[[bytes], Any] = handler.request_deserializer or (lambda data: data)
            requests = relayed.stream(parse) if handler.request_streaming else parse(request or b"")
            behavior: Any = (
                handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream
            )
            answer = behavior(requests, context)
            if not handler.response_streaming:
                context.answer(await answer)
            elif hasattr(answer, "__anext__"):
                async with aclosing(answer):  # ended or cancelled: closed at once, its finally run
                    if handler.request_streaming:
                        async for response in answer:  # resumed once written, as grpc.aio resumes it
                            await context.answer_delivered(response)
                    else:
                        async for response in answer:
                            context.answer(response)
            else:
                await answer  # a streaming handler that writes through the context (health's Watch)
            context.end()
        except grpc.aio.AbortError:
            context.end()
        except asyncio.CancelledError:
            context.end(grpc.StatusCode.CANCELLED, "Cancelled")
        except Exception as exc:  # noqa: BLE001 — as grpc.aio ends a handler's unexpected error
            log.error("relayed_call_failed", method=method, error=repr(exc))
            context.end(grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc)}: {exc}")
