"""The core's socket transport (service/core/core_link.py) where the suite run with --core-transport socket
does not look: errors crossing whole, a version the core does not speak, and a link that breaks
under a running stream (its call and every later one UNAVAILABLE, none left hanging)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from engine.errors import InvalidInput
from proto.ladder.v1 import ladder_pb2 as pb
from service.core.core_link import (
    HELLO,
    LEAVE,
    ORDER,
    TAKEN,
    VALUE,
    CoreServer,
    RemoteCore,
    _pack,
    _unpack,
    core_link,
)
from service.core.orders import ForkDone, ForkOrder
from service.errors import WrongPod
from service.relay import Link
from tests.support.servers import RunningServer, server_config


def test_an_error_crosses_with_its_class_message_and_attributes() -> None:
    wrong = _unpack(_pack(WrongPod("pod-b.s1", "pod-b")))
    assert isinstance(wrong, WrongPod) and wrong.owner == "pod-b" and "pod-b.s1" in str(wrong)
    invalid = _unpack(_pack(InvalidInput("top_p is 2", reason="INVALID_SAMPLING", field="sampling.top_p")))
    assert isinstance(invalid, InvalidInput)
    assert (str(invalid), invalid.reason, invalid.field) == (
        "top_p is 2",
        "INVALID_SAMPLING",
        "sampling.top_p",
    )


def test_an_error_whose_parts_do_not_pickle_crosses_as_its_text() -> None:
    error = RuntimeError("held a lock")
    error.lock = threading.Lock()  # type: ignore[attr-defined]
    crossed = _unpack(_pack(error))
    assert type(crossed) is Exception and "RuntimeError: held a lock" in str(crossed)


async def linked() -> tuple[Link, Link]:
    """The two ends of a core link over a socket pair: the frontend's, the core's."""
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=ours)
    core_reader, core_writer = await asyncio.open_connection(sock=theirs)
    return core_link(reader, writer), core_link(core_reader, core_writer)


class PlayedCore:
    """A frontend's RemoteCore whose core the test plays by hand: `until` reads what the frontend
    sends, `link.send` answers it."""

    def __init__(self, remote: RemoteCore, link: Link) -> None:
        self.remote, self.link = remote, link
        self.answers = asyncio.create_task(remote.run())
        self.seen: list[tuple[int, int, object]] = []

    @classmethod
    async def start(cls) -> PlayedCore:
        frontend, core = await linked()
        return cls(RemoteCore(frontend), core)

    async def until(self, kind: int) -> int:
        """Read until the frontend has sent an item of `kind`; its call."""
        while not any(item[0] == kind for item in self.seen):
            self.seen.extend(await asyncio.wait_for(self.link.receive(), 5) or [])
        return next(call for what, call, _ in self.seen if what == kind)

    def sent(self, kind: int) -> list[object]:
        self.answers.cancel()
        return [payload for what, _, payload in self.seen if what == kind]


def test_a_core_that_speaks_another_version_closes_the_link() -> None:
    async def scenario() -> bytes:
        frontend, core = await linked()
        server = CoreServer(None, core)  # type: ignore[arg-type]
        serving = asyncio.create_task(server.serve())
        frontend.send((HELLO, 0, -1))
        await asyncio.wait_for(serving, 5)
        return await asyncio.wait_for(frontend.reader.read(), 5)  # the core's end closed: EOF

    assert asyncio.run(scenario()) == b""


def test_a_fork_answered_after_its_call_was_left_is_told_not_taken() -> None:
    """The core may run a fork before it reads the frontend's LEAVE (the call's deadline passed
    meanwhile, the core's loop busy): its answer then arrives for no call, and the frontend tells
    the core nobody took it, so the fork is closed instead of staying open for good."""
    done = ForkDone("s1.f", 3, "s1", 1.0)

    async def scenario() -> list[object]:
        core = await PlayedCore.start()
        asking = asyncio.create_task(core.remote.fork(ForkOrder("s1", 0, "", "", "")))
        call = await core.until(ORDER)
        asking.cancel()  # the call ends before its answer: the frontend leaves it
        await core.until(LEAVE)
        core.link.send((VALUE, call, done))  # the fork the core made meanwhile
        await core.until(TAKEN)
        return core.sent(TAKEN)

    assert asyncio.run(scenario()) == [(done, False)]


def test_a_fork_answered_as_its_call_is_left_is_told_not_taken() -> None:
    """The answer may come in the very turn the call ends (its deadline passes as the core answers):
    queued, with the call cancelled before it reads it. Nobody took that fork either: the frontend
    says so, as for an answer that comes after it left (a fresh-clone CI run, 2026-12-06: one such
    fork stayed open and the untaken-forks test timed out)."""
    done = ForkDone("s1.f", 3, "s1", 1.0)

    async def scenario() -> list[object]:
        core = await PlayedCore.start()
        asking = asyncio.create_task(core.remote.fork(ForkOrder("s1", 0, "", "", "")))
        call = await core.until(ORDER)
        queue = core.remote._calls[call]
        queued = queue.put_nowait

        def answered_as_cancelled(item: tuple[int, object]) -> None:
            queued(item)  # type: ignore[arg-type]
            asking.cancel()  # before the call's task runs again to read it

        queue.put_nowait = answered_as_cancelled  # type: ignore[method-assign]
        core.link.send((VALUE, call, done))
        await core.until(TAKEN)
        assert asking.cancelled()
        return core.sent(TAKEN)

    assert asyncio.run(scenario()) == [(done, False)]


def test_a_call_left_before_the_core_started_it_is_forgotten() -> None:
    """ORDER and LEAVE read in one frame (the core's loop was busy while the call's deadline
    passed): the call's task is cancelled before it first runs, and the core keeps nothing of it."""

    async def scenario() -> int:
        frontend, core = await linked()
        server = CoreServer(None, core)  # type: ignore[arg-type]
        serving = asyncio.create_task(server.serve())
        frontend.send((ORDER, 1, ("fork", ForkOrder("s1", 0, "", "", ""))))
        frontend.send((LEAVE, 1, None))
        for _ in range(100):
            await asyncio.sleep(0)
        left = len(server._calls)
        serving.cancel()
        return left

    assert asyncio.run(scenario()) == 0


@pytest.fixture(scope="module")
def server(default_model: Callable[..., Path]) -> Iterator[RunningServer]:
    config = server_config(
        default_model("int4"), max_sessions=4, capacity=512, core_transport="socket", frontends=0
    )
    with RunningServer(config) as running:
        yield running


def test_a_broken_core_link_ends_the_running_stream_and_later_calls_unavailable(
    server: RunningServer,
) -> None:
    request = pb.GenerateRequest(
        prompt=pb.Prompt(text="Once upon a time"),
        stopping=pb.StoppingOptions(max_new_tokens=200, ignore_eos=True),
    )
    stream = server.stub.GenerateStream(request, timeout=30)
    first = next(stream)
    assert first.HasField("token")
    link = server.server._core_link  # the two ends' tasks: cut the core's
    server.loop.call_soon_threadsafe(link[0].cancel)
    with pytest.raises(grpc.RpcError) as ended:
        for _ in stream:
            pass
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.RpcError) as later:
        server.stub.Generate(request, timeout=30)
    assert later.value.code() == grpc.StatusCode.UNAVAILABLE
