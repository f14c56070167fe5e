"""The server's lifecycle: Ladder, grpc.health.v1 and reflection on one grpc.aio server, and the
OpenAI-compatible HTTP API (service/http/) on the same event loop, through the same door.

Entry points (`ladder serve` and `python -m service` go through `service.entry.main`, which reads the
Config before this module's imports, then calls `serve`; tests call `create_server`):
- `await create_server(config) -> (LadderServer, port)`: starts listening (health
  NOT_SERVING), loads the model, then flips health to SERVING. Port 0 picks a free port.
- `await serve(config)`: listen, the Prometheus endpoint, load the model, JSON logs,
  and a graceful drain on SIGTERM/SIGINT. A gRPC or metrics port another process
  holds is one line on stderr naming it, and exit code 1 (before the model loads); so is a
  model directory that cannot be served (exit code 2 when it is not one Ladder reads, as for
  a bad flag; 1 for an unexpected failure). From SIGTERM the process ends within the drain grace
  + 5 s (exiting.py: a watchdog, and no interpreter teardown).
Drain: health flips to NOT_SERVING at once and new calls get UNAVAILABLE; calls
in flight get `drain_seconds` to finish, then end with UNAVAILABLE.
Around it: ports.py (ports held elsewhere), parsing.py (the service's handlers), loading.py
(the model), interceptors/ (access log, status table, tokens), logs.py (JSON logs).
"""

from __future__ import annotations

import asyncio
import errno
import gc
import signal
import sys
import traceback
from typing import Any

import structlog
from grpc_health.v1 import health_pb2

from engine.errors import ModelUnreadable
from engine.executor.step import Stats
from service.config import Config
from service.core.constraints import Constraints
from service.core.core import Core
from service.core.core_link import socket_core
from service.core.orders import CoreApi
from service.core.serving import Serving
from service.core.sessions import SessionRegistry
from service.errors import Draining, refuse_unless_serving
from service.exiting import watchdog
from service.front.front import Front
from service.grpc.door import GrpcDoor
from service.http.app import HttpServer, http_server
from service.interceptors.access_log import AccessLog
from service.limits import raise_file_limit
from service.loading import load_model  # imports engine.tokenizer on the main thread: see loading.py
from service.logs import configure_logging
from service.metrics import Metrics
from service.ports import (
    GRPC_PORT,
    HTTP_PORT,
    METRICS_PORT,
    PortInUse,
    check_port_free,
)
from service.processes.frontends import Frontends
from service.worker.scheduler import Scheduler

log = structlog.get_logger("ladder.server")


class LadderServer:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.metrics = Metrics()
        self.serving: Serving | None = None  # once the model has loaded
        self.front: Front | None = None  # the calls' side of it (service/front/front.py)
        self.draining = False
        self.access_log = AccessLog(self.metrics.call_done)
        # gRPC in this process, or in frontend processes (service/processes/frontend.py) whose calls reach the
        # core here as orders (service/core/core_link.py).
        self.grpc = (
            None
            if config.frontend_processes
            else GrpcDoor(config, self.metrics, self.access_log, self._gate, self._front)
        )
        self.frontends: Frontends | None = None
        self.port = 0
        # The HTTP API in this process, or in the frontend processes beside their gRPC.
        self.http = (
            http_server(config, self.metrics, self.access_log, self._gate, self._front, self._ready)
            if config.http_port and not config.frontend_processes
            else None
        )
        self._tasks: list[asyncio.Task[Any]] = []
        self._core_link: list[asyncio.Task[None]] = []  # --core-transport socket: its two ends
        self._http: Any = None
        self.fault: BaseException | None = None
        self.stopped = asyncio.Event()

    def _ready(self) -> bool:
        return self.serving is not None and not self.draining

    def _gate(self) -> None:
        refuse_unless_serving(self.draining, self.serving is not None)

    def _serving(self) -> Serving:
        """What the servicer's calls share; none before the model has loaded (the gate refuses the call)."""
        refuse_unless_serving(False, self.serving is not None)
        assert self.serving is not None
        return self.serving

    def _front(self) -> Front:
        """The calls' side of what `_serving` returns."""
        self._serving()
        assert self.front is not None
        return self.front

    async def start(self) -> int:
        check_port_free(self.config.host, self.config.port, GRPC_PORT)
        check_port_free(self.config.host, self.config.http_port, HTTP_PORT)
        if self.grpc is not None:
            self.port = await self.grpc.start(self.config.port)
        else:
            self.port = await self._start_frontends()
        if self.http is not None:
            try:
                await self._start_http(self.http)
            except BaseException:
                await self._stop_grpc(0)
                raise
        log.info(
            "listening",
            port=self.port,
            http_port=self.config.http_port,
            tls=self.config.tls,
            auth=self.config.auth,
            frontends=self.config.frontend_processes,
        )
        return self.port

    async def _start_frontends(self) -> int:
        """The gRPC port served by frontend processes (service/processes/frontends.py); their call metrics are
        part of this process's /metrics."""
        self.frontends = Frontends(self.config, self._fault)
        self.metrics.registry.others = self.frontends.families_now
        try:
            return await self.frontends.start(self.config.port)
        except BaseException:
            await self.frontends.stop(0)
            raise

    async def _stop_grpc(self, grace: float) -> None:
        if self.grpc is not None:
            await self.grpc.stop(grace)
        if self.frontends is not None:
            await self.frontends.stop(grace)

    async def _start_http(self, http: HttpServer) -> None:
        try:
            await http.start()
        except OSError as exc:  # taken between the check and the bind
            if exc.errno == errno.EADDRINUSE:
                raise PortInUse(f"{HTTP_PORT} {self.config.http_port} is in use by another process") from None
            raise

    async def load(self, freeze: bool = False) -> None:
        """Load the model, start the engine worker, turn health SERVING. With `freeze` (a process that
        only serves: `serve`) what start-up built is then kept out of the garbage collector's sight."""
        model = await asyncio.to_thread(load_model, self.config)
        loop = asyncio.get_running_loop()

        def on_fault(exc: BaseException) -> None:  # called on the worker thread
            loop.call_soon_threadsafe(self._fault, exc)

        scheduler = Scheduler(
            model.engine, self.config.max_queue, on_fault=on_fault, on_forward=self.metrics.forward_done
        )
        sessions = SessionRegistry(
            self.config.pod_name, self.config.sessions_per_caller, parking=model.session_memory > 0
        )
        constraints = Constraints(
            model.tokenizer,
            model.facts,
            self.config.constraint_cache_mb << 20,
            self.metrics,
            self.config.constraint_compile_seconds,
            self.config.json_schema_strict,
        )
        serving = Serving(self.config, model, scheduler, sessions, self.metrics, constraints)
        core: CoreApi = Core(serving)
        if self.config.core_transport == "socket":
            core, self._core_link = await socket_core(Core(serving))
        self.front = Front(self.config, model, self.metrics, core)
        self.serving = serving
        if self.frontends is not None:  # their gRPC calls reach a Core of their own
            await self.frontends.serve_core(Core(serving), model.spec)
        engine = model.engine
        self.metrics.watch(
            lambda: scheduler.depth,
            lambda: len(sessions),
            lambda: scheduler.waiting,
            lambda: engine.rows_held / max(1, model.facts.slots),
        )
        self.metrics.describe_model(
            {"model": model.name, "provider": model.facts.provider, "pod": self.config.pod_name}
        )
        self.metrics.engine_stats(await scheduler.run(Stats()))
        self._tasks.append(asyncio.create_task(self._housekeeping()))
        if freeze:
            # What start-up built (the model, its sessions and shapes, the tokenizer, the imports) lives
            # as long as the server: out of the collector's sight, a full collection under load walks
            # only what calls made since (bench/results/gc-freeze-cpu-2026-12-02: the longest pause,
            # every thread stopped, 46-67 -> 25-28 ms). Not in a process that also runs other things
            # (the tests' servers): their cycles would never be collected.
            gc.collect()
            gc.freeze()
        if self.grpc is not None:
            await self.grpc.set_health(health_pb2.HealthCheckResponse.SERVING)
        log.info(
            "serving",
            model=model.name,
            capacity=model.capacity,
            ladder=model.facts.ladder,
            slots=model.facts.slots,
            session_memory_mb=model.session_memory >> 20,
        )

    def _fault(self, exc: BaseException) -> None:
        """The executor can no longer be trusted: flip health and drain (the pod is then replaced)."""
        log.error("engine_fault", error=str(exc))
        if self.fault is None and not self.draining:
            self.fault = exc
            self._tasks.append(asyncio.create_task(self.drain()))

    async def _housekeeping(self) -> None:
        """Expire idle sessions and refresh the variant gauges, a few times per idle period."""
        serving = self._serving()
        period = max(0.05, min(5.0, self.config.session_idle_seconds / 4))
        while True:
            await asyncio.sleep(period)
            for state in serving.sessions.idle(self.config.session_idle_seconds):
                log.info("session_expired", session=state.id, length=state.session.length)
                serving.close_soon(state, "expired")
            stats = await serving.scheduler.run(Stats())
            self.metrics.engine_stats(stats)

    async def drain(self, grace: float | None = None) -> None:
        """Refuse new work now; give calls in flight `grace` seconds, then end them with UNAVAILABLE."""
        grace = self.config.drain_seconds if grace is None else grace
        if self.draining:  # a second drain (a signal during a fault's drain) waits for the first
            await self.stopped.wait()
            return
        self.draining = True
        log.info("draining", in_flight=self.access_log.in_flight, grace=grace)
        # The gRPC door's drain waits for the HTTP calls too (one access log); frontends drain theirs.
        doors = [self.grpc.drain(grace) if self.grpc is not None else self.access_log.settled(grace)]
        if self.frontends is not None:
            doors.append(self.frontends.drain(grace))
        left = sum(await asyncio.gather(*doors))
        if self.serving is not None and left:
            self.serving.scheduler.abort_all(Draining("the server shut down before the call finished"))
            await asyncio.sleep(0.2)
        await self.stop()

    def start_metrics(self, port: int) -> None:
        """Serve /metrics over HTTP on `port` (0: not at all) until the server stops."""
        what = METRICS_PORT
        try:
            self._http = self.metrics.serve_http(port, self.config.host)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUse(f"{what} {port} is in use by another process") from None
            raise

    async def stop(self, grace: float = 0.5) -> None:
        if self.stopped.is_set():
            return
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        await self._stop_grpc(grace)
        if self.http is not None:
            await self.http.stop()
        for task in self._core_link:  # after the calls: they reach the core through it
            task.cancel()
        if self.serving is not None:
            self.serving.scheduler.stop()
            self.serving.constraints.close()
        if self._http is not None:
            self._http.shutdown()
        self.stopped.set()
        log.info("stopped")


async def create_server(config: Config) -> tuple[LadderServer, int]:
    """Start listening, load the model, turn health SERVING; returns the server and its bound port."""
    server = LadderServer(config)
    port = await server.start()
    try:
        await server.load()
    except BaseException:
        await server.stop()
        raise
    return server, port


async def serve(config: Config) -> int:
    """Serve until SIGTERM or SIGINT (then drain gracefully) or an engine fault; the exit code."""
    configure_logging(config.log_level)
    raise_file_limit()  # before the gRPC server's options: its connection cap is half of it
    signalled = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signalled.set)
    server = LadderServer(config)
    try:
        server.start_metrics(config.metrics_port)
        port = await server.start()
    except PortInUse as exc:
        print(f"ladder serve: {exc}", file=sys.stderr)
        if server._http is not None:
            server._http.shutdown()
        return 1
    try:
        await server.load(freeze=True)
    except Exception as exc:  # noqa: BLE001 — the model directory is not one Ladder can serve
        await server.stop()
        return _cannot_serve(config, exc)
    except BaseException:
        await server.stop()
        raise
    waits = [asyncio.create_task(signalled.wait()), asyncio.create_task(server.stopped.wait())]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in waits:
        task.cancel()
    log.info("shutting_down", port=port, signal=signalled.is_set(), fault=repr(server.fault))
    watchdog(config.drain_seconds)  # a drain that hangs still ends: the process's end is bounded
    await server.drain()
    return 1 if server.fault is not None else 0


def _cannot_serve(config: Config, exc: Exception) -> int:
    """Say in one line why the model cannot be served; the exit code. A directory that is not a model
    Ladder can read is a bad setting (exit 2, as a bad flag); anything else is unexpected (exit 1,
    its traceback in the JSON log as `model_load_failed`)."""
    if isinstance(exc, ModelUnreadable):
        print(f"ladder serve: cannot serve model {config.model!r}: {exc}", file=sys.stderr)
        return 2
    log.error("model_load_failed", error=repr(exc), traceback="".join(traceback.format_exception(exc)))
    print(f"ladder serve: cannot serve model {config.model!r}: {type(exc).__name__}: {exc}", file=sys.stderr)
    return 1
