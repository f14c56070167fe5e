"""Real Ladder servers for tests: grpc.aio on a loopback port, on an event loop of a thread of its own.

Sync channels, asyncio clients in the test's own loop and subprocesses (grpcurl, node, the C++
client) all reach it over a real channel; the engine is the real executor on a generated model.
Besides its address and a stub, `RunningServer` gives tests what they may observe (stats over
gRPC, the scheduler's step log, call counts) and what they may hold to make an order exact
(`frozen`: the engine worker inside a call; `paused`: the event loop), so no test waits for a
time to pass or reaches into the server's private state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
import random
import socket
import threading
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import grpc
import pytest

from proto.ladder.v1 import ladder_pb2 as pb
from proto.ladder.v1 import ladder_pb2_grpc
from service.config import Config
from service.server import LadderServer, create_server
from service.worker.rounds import Call, StepRecord
from service.worker.scheduler import Scheduler
from tests.support import engines

T = TypeVar("T")
# Both ways gRPC is served: in the server's own process, and by two frontend processes whose calls
# reach its core as orders (--frontends, service/processes/frontend.py). A test or fixture parametrized by
# these holds for both.
FRONTENDS = (0, 2)
FRONTENDS_IDS = ("in-process", "frontends")
both_ways = pytest.mark.parametrize("frontends", FRONTENDS, ids=FRONTENDS_IDS)
START_TIMEOUT_S = 60.0  # load, warm-up and health SERVING; a bound, not a pace


def free_port() -> int:
    """A port nothing listens on now, on loopback and the wildcard address (for a server that must
    be told its port). Chosen below the kernel's ephemeral range, in a slice of its own for this
    xdist worker: a port from the ephemeral range can be taken, between choosing and binding, as the
    local end of any outgoing connection (the hostile-client tests open thousands)."""
    low = _ephemeral_low()
    width = (low - PORTS_FROM) // PORT_SLICES
    start = PORTS_FROM + _worker_index() % PORT_SLICES * width
    for _ in range(200):
        port = random.randrange(start, start + width)
        if _bindable(port):
            return port
    raise RuntimeError(f"no free port in {start}..{start + width - 1}")


PORTS_FROM = 10_000  # above the well-known and registered ports most hosts run services on
PORT_SLICES = 16  # xdist workers get slices of their own, so two never pick the same port


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            return max(int(f.read().split()[0]), PORTS_FROM + PORT_SLICES * 100)
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def _worker_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker[2:]) if worker[2:].isdigit() else 0


def _bindable(port: int) -> bool:
    for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((address, port))
        except OSError as exc:
            if family == socket.AF_INET6 and exc.errno == errno.EADDRNOTAVAIL:
                continue  # a host without IPv6
            return False
    return True


# Every test server's (pytest --core-transport: tests/support/fixtures.py): "direct", "socket", or
# "frontends" (served by one frontend process unless the test names its frontends).
CORE_TRANSPORT = "direct"


def server_config(model: object, **changes: Any) -> Config:
    """Loopback, a free port, no metrics endpoint, the pod "pod-a", this worker's share of the cores
    (tests/support/engines.py); `changes` override any field."""
    base = Config(
        host="127.0.0.1",
        port=0,
        metrics_port=0,
        http_port=0,
        model=str(model),
        pod_name="pod-a",
        max_sessions=12,
        max_new_tokens=256,
        drain_seconds=5.0,
        intra_op_threads=engines.INTRA_OP_THREADS,
        core_transport="direct" if CORE_TRANSPORT == "frontends" else CORE_TRANSPORT,
        frontends=1 if CORE_TRANSPORT == "frontends" else None,
    )
    return dataclasses.replace(base, **changes)


class RunningServer:
    """A LadderServer serving from the moment it is built; `close()` (or leaving `with`) stops it."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="ladder-test-server", daemon=True)
        self.thread.start()
        self.server: LadderServer
        try:
            # create_server listens, loads the model and turns health SERVING before it returns.
            self.server, self.port = self.run(create_server(config), START_TIMEOUT_S)
        except BaseException:
            self._stop_loop()
            raise
        self.address = f"127.0.0.1:{self.port}"
        self.channel = grpc.insecure_channel(self.address)
        self.stub = ladder_pb2_grpc.LadderStub(self.channel)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = START_TIMEOUT_S) -> T:
        """Run `coro` on the server's event loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stats(self) -> pb.EngineStats:
        return self.stub.GetEngineStats(pb.GetEngineStatsRequest())

    @property
    def scheduler(self) -> Scheduler:
        assert self.server.serving is not None, "the server has no model loaded"
        return self.server.serving.scheduler

    def steps(self) -> list[StepRecord]:
        """The scheduler's log of rounds so far, oldest first: what each round ran, in order."""
        return list(self.scheduler.steps)

    def calls(self, method: str, code: str) -> float:
        """How many `method` calls ended with `code` (the ladder_calls_total counter)."""
        labels = {"protocol": "grpc", "method": method, "code": code}
        return self.server.metrics.registry.get_sample_value("ladder_calls_total", labels) or 0.0

    def frontend_calls(self) -> list[int]:
        """How many calls each frontend process has finished (its ladder_calls_total, all codes)."""
        frontends = self.server.frontends
        assert frontends is not None, "the server runs no frontends"
        return [
            int(sum(value for name, _, value in samples if name == "ladder_calls_total"))
            for families, _ in self.run(frontends.snapshots())
            for family, samples in families
            if family == "ladder_calls"
        ]

    def in_flight(self) -> int:
        """Calls in flight, wherever they are served: this process's and every frontend's."""
        frontends = self.server.frontends
        there = sum(n for _, n in self.run(frontends.snapshots())) if frontends is not None else 0
        return self.server.access_log.in_flight + there

    def fault(self, error: BaseException) -> None:
        """Report `error` as the engine worker reports a fault (health flips, the server drains)."""
        self.loop.call_soon_threadsafe(self.server._fault, error)

    @contextmanager
    def frozen(self) -> Iterator[Scheduler]:
        """Hold the engine worker inside a call until the block ends; yields the scheduler.

        While it is held nothing a call asked for runs, so a test can end or time a call at a
        known point instead of racing the model."""
        scheduler = self.scheduler
        inside, release = threading.Event(), threading.Event()

        def hold() -> None:
            inside.set()
            release.wait(START_TIMEOUT_S)

        def body() -> Iterator[Any]:
            yield Call(hold)

        async def submit() -> None:
            scheduler.submit(body(), bounded=False)

        self.run(submit())
        assert inside.wait(START_TIMEOUT_S), "the engine worker did not come round"
        try:
            yield scheduler
        finally:
            release.set()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the server's event loop: no call sends or receives anything until the block ends."""
        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            held.set()
            release.wait(START_TIMEOUT_S)

        self.loop.call_soon_threadsafe(hold)
        assert held.wait(START_TIMEOUT_S), "the server's event loop did not come round"
        try:
            yield
        finally:
            release.set()

    def close(self) -> None:
        self.channel.close()
        try:
            if not self.server.draining:
                self.run(self.server.stop())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
