"""The core's orders over a socket (issue #42): `RemoteCore`, a frontend's `CoreApi` whose orders
travel to another end, and `CoreServer`, which answers them there with that process's `Core`.

The wire is service/relay.py's `Link` (length-prefixed frames, every item of one
event-loop turn in one frame) with `pickle` for the values, since orders and events are
dataclasses (service/core/orders.py; `VERSION` is checked in the first frame). An item is
`(kind, call, payload)`, `call` numbering one frontend's orders:

- frontend to core: ORDER (method, order), VERDICT (sample, index, cut), PART (a Prefill's token
  ids), PEEK, KEEP, LEAVE (the frontend is done with the call: what still runs for it is
  cancelled, a Prefill's session released), TAKEN (a fork's ForkDone, taken or not);
- core to frontend: EVENTS (a list of events), VALUE (an answer, or None to end a Prefill part),
  FAILED (an error, rebuilt as raised), END (the call is over on the core: a Decode's or a
  Prefill's session released).

An error crosses as its class, arguments and attributes (a service error keeps its reason, field
and metadata, so the status table maps it as if raised here); one whose parts do not pickle
crosses as a plain Exception with its text (INTERNAL). When the other end goes away, every call in
flight fails with `CoreGone` (UNAVAILABLE) and new orders are refused the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import pickle
import socket
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import structlog

from service.core.core import Core, PrefillSession
from service.core.orders import (
    VERSION,
    CloseOrder,
    CoreCall,
    DecodeOrder,
    ForkDone,
    ForkOrder,
    GenerateOrder,
    PrefillOrder,
    RewindOrder,
    StatsDone,
    Verdicts,
)
from service.errors import Draining
from service.events import PrefillFinished
from service.relay import Link
from service.worker.jobs import Event

log = structlog.get_logger("ladder.core_link")

ORDER, VERDICT, PART, PEEK, KEEP, LEAVE, TAKEN, HELLO = range(8)
EVENTS, VALUE, FAILED, END = range(10, 14)
Item = tuple[int, int, Any]


class CoreGone(Draining):
    """The core's end of the link has gone: the call cannot go on (UNAVAILABLE, retry)."""


def _pack(error: BaseException) -> tuple[type[BaseException], tuple[Any, ...], dict[str, Any]]:
    """An error as its class, arguments and attributes, when those cross; else its text."""
    packed = (type(error), error.args, dict(vars(error)))
    try:
        pickle.dumps(packed)
    except Exception:  # noqa: BLE001 — anything that does not pickle crosses as text
        return (Exception, (f"{type(error).__name__}: {error}",), {})
    return packed


def _unpack(packed: tuple[type[BaseException], tuple[Any, ...], dict[str, Any]]) -> BaseException:
    """The error as it was raised (its class's own __init__ is not run again: args and attributes
    are set as they were)."""
    kind, args, attributes = packed
    error = kind.__new__(kind)
    BaseException.__init__(error, *args)
    vars(error).update(attributes)
    return error


def core_link(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Link:
    """One end of a core link (either side)."""
    return Link(reader, writer)


# -- the frontend's side ----------------------------------------------------------------------


class _RemoteVerdicts:
    def __init__(self, link: Link, call: int) -> None:
        self._link, self._call = link, call

    def passes(self, sample: int, index: int) -> None:
        self._link.send((VERDICT, self._call, (sample, index, False)))

    def stops(self, sample: int, index: int) -> None:
        self._link.send((VERDICT, self._call, (sample, index, True)))


class RemoteCore:
    """A `CoreApi` whose orders go over `link` to a `CoreServer`. `run()` reads the answers (start it
    as a task); when the link ends, every call in flight fails with CoreGone."""

    def __init__(self, link: Link) -> None:
        self._link = link
        self._calls: dict[int, asyncio.Queue[tuple[int, Any]]] = {}
        self._serials = itertools.count(1)
        self._gone = False
        link.send((HELLO, 0, VERSION))

    async def run(self) -> None:
        try:
            while (items := await self._link.receive()) is not None:
                for kind, call, payload in items:
                    queue = self._calls.get(call)
                    if queue is not None:
                        queue.put_nowait((kind, payload))
                    else:  # made after the call was left: the core ran it before it read the LEAVE
                        self._unread(kind, payload)
        finally:
            self._gone = True
            gone = _pack(CoreGone("the server's core has gone; retry"))
            for queue in self._calls.values():
                queue.put_nowait((FAILED, gone))

    def _open(self, method: str, order: Any, call: int = 0) -> tuple[int, asyncio.Queue[tuple[int, Any]]]:
        if self._gone:
            raise CoreGone("the server's core has gone; retry")
        call = call or next(self._serials)
        queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self._calls[call] = queue
        self._link.send((ORDER, call, (method, order)))
        return call, queue

    def _leave(self, call: int) -> None:
        queue = self._calls.pop(call, None)
        if queue is None:
            return
        if not self._gone:
            self._link.send((LEAVE, call, None))
        # What came as the call was left (its deadline passed just as the core answered: the answer
        # queued, the task cancelled before it read it) is as unread as what comes after.
        while not queue.empty():
            self._unread(*queue.get_nowait())

    def _unread(self, kind: int, payload: Any) -> None:
        """An answer no call reads (its deadline passed, its client went): a fork in it was taken by
        nobody, and is closed."""
        if kind == VALUE and isinstance(payload, ForkDone) and not payload.retry:
            self.fork_taken(payload, taken=False)

    async def _stream(self, method: str, order: Any, call: int) -> AsyncGenerator[list[Event], None]:
        call, queue = self._open(method, order, call)
        try:
            while True:
                kind, payload = await queue.get()
                if kind == EVENTS:
                    yield payload
                elif kind == FAILED:
                    raise _unpack(payload)
                elif kind == END:
                    self._calls.pop(call, None)
                    return
        finally:
            self._leave(call)

    def _call(self, method: str, order: Any) -> CoreCall:
        """The call's number is its own from now; its order goes at the first event asked for."""
        call = next(self._serials)
        return CoreCall(self._stream(method, order, call), _RemoteVerdicts(self._link, call))

    def generate(self, order: GenerateOrder) -> CoreCall:
        return self._call("generate", order)

    def decode(self, order: DecodeOrder) -> CoreCall:
        return self._call("decode", order)

    async def _ask(self, method: str, order: Any) -> Any:
        call, queue = self._open(method, order)
        try:
            kind, payload = await queue.get()
            if kind == FAILED:
                raise _unpack(payload)
            return payload
        finally:
            self._leave(call)

    async def rewind(self, order: RewindOrder) -> int:
        length: int = await self._ask("rewind", order)
        return length

    async def close(self, order: CloseOrder) -> int:
        length: int = await self._ask("close", order)
        return length

    async def fork(self, order: ForkOrder) -> ForkDone:
        done: ForkDone = await self._ask("fork", order)
        return done

    def fork_taken(self, done: ForkDone, taken: bool) -> None:
        if not self._gone:
            self._link.send((TAKEN, 0, (done, taken)))

    async def stats(self) -> StatsDone:
        done: StatsDone = await self._ask("stats", None)
        return done

    @contextlib.asynccontextmanager
    async def prefill(self, order: PrefillOrder) -> AsyncIterator[_RemotePrefill]:
        call, queue = self._open("prefill", order)
        try:
            kind, payload = await queue.get()
            if kind == FAILED:
                raise _unpack(payload)
            yield _RemotePrefill(self._link, call, queue, payload)
        finally:
            if self._calls.get(call) is queue and not self._gone:
                self._link.send((LEAVE, call, None))
                # The core releases the session (undone unless kept) before it ends the call: the
                # client hears "done" only after that, so its next call on the session goes through.
                while (await queue.get())[0] not in (END, FAILED):
                    pass
            self._calls.pop(call, None)


class _RemotePrefill:
    def __init__(self, link: Link, call: int, queue: asyncio.Queue[tuple[int, Any]], session_id: str) -> None:
        self._link, self._call, self._queue = link, call, queue
        self._session_id = session_id

    @property
    def session_id(self) -> str:
        return self._session_id

    async def part(self, tokens: list[int]) -> AsyncGenerator[list[Event], None]:
        self._link.send((PART, self._call, tokens))
        while True:
            kind, payload = await self._queue.get()
            if kind == EVENTS:
                yield payload
            elif kind == FAILED:
                raise _unpack(payload)
            elif kind == VALUE:  # the part's end
                return

    async def peek(self) -> PrefillFinished:
        self._link.send((PEEK, self._call, None))
        kind, payload = await self._queue.get()
        if kind == FAILED:
            raise _unpack(payload)
        assert isinstance(payload, PrefillFinished)
        return payload

    def keep(self) -> None:
        self._link.send((KEEP, self._call, None))


# -- the core's side --------------------------------------------------------------------------


@dataclass
class _Served:
    task: asyncio.Task[None] | None = None
    verdicts: Verdicts | None = None
    prefill: PrefillSession | None = None  # a Prefill's, once open
    left: bool = False  # the frontend left the call (LEAVE): a cancel it asked for
    inbox: asyncio.Queue[tuple[int, Any]] = field(default_factory=asyncio.Queue)


class CoreServer:
    """Answers one link's orders with `core`; `serve()` returns when the link ends (every call it
    had in flight cancelled: their sessions released, unfinished Prefills undone)."""

    def __init__(self, core: Core, link: Link) -> None:
        self.core, self._link = core, link
        self._calls: dict[int, _Served] = {}

    async def serve(self) -> None:
        try:
            while (items := await self._link.receive()) is not None:
                for kind, call, payload in items:
                    self._on(kind, call, payload)
        finally:
            tasks = [served.task for served in self._calls.values() if served.task is not None]
            for task in tasks:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                if tasks:  # their failures go out before the link closes
                    await asyncio.wait(tasks, timeout=1.0)
            self._link.close()

    def _on(self, kind: int, call: int, payload: Any) -> None:
        if kind == HELLO:
            if payload != VERSION:
                log.error("core_link_version", theirs=payload, ours=VERSION)
                self._link.close()
            return
        if kind == ORDER:
            served = self._calls[call] = _Served()
            served.task = asyncio.create_task(self._run(call, served, *payload))
            # A call left before its task first ran (ORDER and LEAVE read together) never enters
            # _run, whose `finally` forgets it: forgotten here, or every such call stays for good.
            served.task.add_done_callback(lambda _: self._calls.pop(call, None))
            return
        if kind == TAKEN:
            done, taken = payload
            self.core.fork_taken(done, taken)
            return
        served_or_none = self._calls.get(call)
        if served_or_none is None:
            return  # the call has ended here already
        if kind == VERDICT:
            sample, index, cut = payload
            if served_or_none.verdicts is not None:
                (served_or_none.verdicts.stops if cut else served_or_none.verdicts.passes)(sample, index)
        elif kind == LEAVE:
            served_or_none.left = True
            if served_or_none.task is not None:
                served_or_none.task.cancel()
        elif kind == KEEP:  # at once: a LEAVE may follow in the same frame
            if served_or_none.prefill is not None:
                served_or_none.prefill.keep()
        else:
            served_or_none.inbox.put_nowait((kind, payload))

    async def _run(self, call: int, served: _Served, method: str, order: Any) -> None:
        send, core = self._link.send, self.core
        # This task's own context: the core's log lines (and its jobs' debug lines) name the call.
        structlog.contextvars.bind_contextvars(request_id=getattr(order, "request_id", ""))
        try:
            if method in ("generate", "decode"):

                def sink(events: list[Event]) -> None:
                    """The worker's events straight onto the link: no task wakes per call and step
                    (none once the frontend left or the call ended here)."""
                    if not served.left and call in self._calls:
                        send((EVENTS, call, events))

                ordered = core.generate if method == "generate" else core.decode
                core_call = ordered(order, sink)
                served.verdicts = core_call.verdicts
                async with aclosing(core_call.events) as batches:
                    async for events in batches:
                        send((EVENTS, call, events))
            elif method == "prefill":
                await self._prefill(call, served, order)
            elif method == "stats":
                send((VALUE, call, await core.stats()))
            else:
                send((VALUE, call, await getattr(core, method)(order)))
        except asyncio.CancelledError:
            if not served.left:  # the core stopped it (its link is ending): the call fails
                send((FAILED, call, _pack(CoreGone("the server's core stopped this call; retry"))))
        except Exception as exc:  # noqa: BLE001 — every failure is the frontend's to raise
            send((FAILED, call, _pack(exc)))
        finally:
            self._calls.pop(call, None)
            send((END, call, None))

    async def _prefill(self, call: int, served: _Served, order: PrefillOrder) -> None:
        send = self._link.send
        async with self.core.prefill(order) as session:
            served.prefill = session
            send((VALUE, call, session.session_id))
            while True:
                kind, payload = await served.inbox.get()
                if kind == PART:
                    async with aclosing(session.part(payload)) as batches:
                        async for events in batches:
                            send((EVENTS, call, events))
                    send((VALUE, call, None))
                elif kind == PEEK:
                    send((VALUE, call, await session.peek()))


async def socket_core(core: Core) -> tuple[RemoteCore, list[asyncio.Task[None]]]:
    """A RemoteCore reaching `core` over a local socket pair in this process (--core-transport
    socket), and the two tasks that serve the link's ends (cancel them to stop)."""
    ours, theirs = socket.socketpair()
    core_reader, core_writer = await asyncio.open_connection(sock=theirs)
    reader, writer = await asyncio.open_connection(sock=ours)
    server = CoreServer(core, core_link(core_reader, core_writer))
    remote = RemoteCore(core_link(reader, writer))
    return remote, [asyncio.create_task(server.serve()), asyncio.create_task(remote.run())]
