"""A gRPC frontend process (`--frontends N`): the whole gRPC side of the server in a process of its own.

Started by the server's process with its control socket's path and its index (service/processes/frontends.py),
it is told the Config and binds the port with SO_REUSEPORT (the kernel spreads connections over the
frontends). It runs what a gRPC call needs before and after the engine (service/grpc/door.py): grpc.aio
with its own servicer contexts, the interceptors (access log, drain gate, peer limits, tokens), protobuf,
the servicer, tokenization, chat templates, detokenization and stop strings. Its Front's core is a
RemoteCore: the core's orders go over a second socket as token ids (service/core/core_link.py), and the
server's process runs only the core's side (sessions, scheduler, engine).

Until the model has loaded every call gets UNAVAILABLE (MODEL_LOADING), as in one process; then the
server sends the model's facts and limits (MODEL), the frontend reads the tokenizer from the model
directory itself, connects to the core and turns health SERVING. Signals are the server's to act on
(it drains every frontend, then tells them to stop); when the server's process goes away, calls in
flight end UNAVAILABLE (the core has gone) and the process exits.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog
from google.protobuf.internal import api_implementation
from grpc_health.v1 import health_pb2

from service import relay
from service.config import Config
from service.core.core_link import RemoteCore, core_link
from service.errors import refuse_unless_serving
from service.front.front import Front
from service.grpc.door import GrpcDoor
from service.http.app import http_server
from service.interceptors.access_log import AccessLog
from service.limits import raise_file_limit
from service.logs import configure_logging
from service.merged_metrics import call_families
from service.metrics import Metrics
from service.ports import PortInUse
from service.relay import Link
from service.served_model import ModelSpec, ModelView, read_tokenizer

log = structlog.get_logger("ladder.frontend")
GONE_GRACE_S = 0.5  # for calls in flight to send their UNAVAILABLE once the server has gone


class Frontend:
    """One frontend's gRPC door and its part of the control link."""

    def __init__(self, config: Config, control: Link, index: int) -> None:
        self.config, self.control, self.index = config, control, index
        self.metrics = Metrics()
        self.access_log = AccessLog(self.metrics.call_done)
        self.front: Front | None = None
        self.draining = False
        self.door = GrpcDoor(config, self.metrics, self.access_log, self._gate, self._front, share_port=True)
        self.http = (
            http_server(
                config, self.metrics, self.access_log, self._gate, self._front, self._ready, share_port=True
            )
            if config.http_port
            else None
        )
        self._tasks: set[asyncio.Task[Any]] = set()

    def _gate(self) -> None:
        refuse_unless_serving(self.draining, self.front is not None)

    def _ready(self) -> bool:
        return self.front is not None and not self.draining

    def _front(self) -> Front:
        assert self.front is not None  # the gate let the call in
        return self.front

    async def take_model(self, spec: ModelSpec, core_path: str) -> str:
        """Build the model view (the tokenizer read here), reach the core, turn SERVING; "" or why not."""
        try:
            tokenizer = await asyncio.to_thread(read_tokenizer, Path(spec.name))
            reader, writer = await asyncio.open_unix_connection(core_path)
        except Exception as exc:  # noqa: BLE001 — told to the server, which stops
            return f"{type(exc).__name__}: {exc}"
        remote = RemoteCore(core_link(reader, writer))
        self._keep(asyncio.create_task(remote.run()))
        self.front = Front(self.config, ModelView(spec, tokenizer), self.metrics, remote)
        await self.door.set_health(health_pb2.HealthCheckResponse.SERVING)
        return ""

    async def drain(self, grace: float) -> int:
        self.draining = True
        return await self.door.drain(grace)

    def snapshot(self) -> tuple[Any, int]:
        return call_families(self.metrics.registry), self.access_log.in_flight

    async def serve(self) -> None:
        """Answer the server's items until it says stop (or goes), then stop the door within the
        grace it gives: what the calls still there send in that time is delivered."""
        grace = GONE_GRACE_S
        while (items := await self.control.receive()) is not None:
            stop = next((payload for kind, _, payload in items if kind == relay.STOP), None)
            for kind, serial, payload in items:
                if kind != relay.STOP:
                    self._keep(asyncio.create_task(self._answer(kind, serial, payload)))
            if stop is not None:
                grace = float(stop)
                break
        await self.door.stop(grace)
        if self.http is not None:
            await self.http.stop()
        for task in list(self._tasks):
            task.cancel()

    async def _answer(self, kind: int, serial: int, payload: Any) -> None:
        if kind == relay.MODEL:
            self.control.send((relay.LOADED, serial, await self.take_model(*payload)))
        elif kind == relay.DRAIN:
            self.control.send((relay.DRAINED, serial, await self.drain(float(payload))))
        elif kind == relay.METRICS:
            self.control.send((relay.SNAPSHOT, serial, self.snapshot()))

    def _keep(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def run(path: str, index: int) -> int:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: None)  # the server drains, then says stop
    reader, writer = await asyncio.open_unix_connection(path)
    control = Link(reader, writer)
    control.send((relay.HELLO, 0, index))
    items = await control.receive()
    if not items or items[0][0] != relay.SETTINGS:
        return 1
    _, serial, (config, port) = items[0]
    configure_logging(config.log_level)
    raise_file_limit()  # before the door's options: the connection cap's default is half of it
    frontend = Frontend(config, control, index)
    try:
        port = await frontend.door.start(port)
        if frontend.http is not None:
            await frontend.http.start()
    except (PortInUse, OSError) as exc:
        control.send((relay.READY, serial, (0, str(exc))))
        await frontend.door.stop(0)
        control.close()
        return 1
    control.send((relay.READY, serial, (port, "")))
    log.info(
        "frontend_listening", index=index, port=port, pid=os.getpid(), protobuf=api_implementation.Type()
    )
    await frontend.serve()
    control.close()
    return 0


def main(argv: Sequence[str]) -> None:
    path, index = argv
    raise SystemExit(asyncio.run(run(path, int(index))))
