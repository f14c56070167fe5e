"""The gRPC server: Ladder, grpc.health.v1 and reflection on one grpc.aio server.

Entry points (`ladder serve` and `python -m service` go through `service.entry.main`, which reads the
Config before this module's imports, then calls `serve`; tests call `create_server`):
- `await create_server(config) -> (LadderServer, port)`: starts listening (health
  NOT_SERVING), loads the model, then flips health to SERVING. Port 0 picks a free port.
- `await serve(config)`: listen, the Prometheus endpoint, load the model, JSON logs,
  and a graceful drain on SIGTERM/SIGINT. A gRPC or metrics port another process
  holds is one line on stderr naming it, and exit code 1 (before the model loads); so is a
  model directory that cannot be served (exit code 2 when it is not one Ladder reads, as for
  a bad flag; 1 for an unexpected failure).
Drain: health flips to NOT_SERVING at once and new calls get UNAVAILABLE; calls
in flight get `drain_seconds` to finish, then end with UNAVAILABLE.
Request bytes that are not the RPC's message are INVALID_ARGUMENT (`add_ladder_service`).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import signal
import socket
import sys
import time
import traceback
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import structlog
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from engine.errors import InvalidInput, ModelUnreadable
from engine.executor import Engine
from engine.executor.step import Stats
from engine.tokenizer import Tokenizer, TokenizerUnreadable  # at import, on the main thread: see load_model
from proto.ladder.v1 import ladder_pb2, ladder_pb2_grpc
from service.config import Config
from service.constraints import Constraints
from service.errors import Draining
from service.generation import ServedModel
from service.metrics import Metrics
from service.reflection import enable as documented_reflection
from service.scheduler import Scheduler
from service.security import CallInterceptor, server_credentials
from service.servicer import LadderServicer
from service.serving import Serving
from service.sessions import SessionRegistry

log = structlog.get_logger("ladder.server")


class PortInUse(Exception):
    """A port the server must listen on is held by another process."""


def check_port_free(host: str, port: int, what: str) -> None:
    """Raise PortInUse when something already listens on host:port (port 0 is always free).

    gRPC's own bind failure says neither which port nor why, and with SO_REUSEPORT (gRPC's
    default, turned off here) a second server would share a port instead of failing."""
    if not port:
        return
    try:
        infos = socket.getaddrinfo(host.strip("[]") or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return  # gRPC reports an address it cannot resolve itself
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUse(f"{what} {port} on {host} is in use by another process") from None
            raise
SERVICE_NAME = ladder_pb2.DESCRIPTOR.services_by_name["Ladder"].full_name
HEALTH_NAMES = ("", SERVICE_NAME)


@dataclass(frozen=True)
class Unparsed:
    """The request bytes of one message that did not parse (corrupt wire format, bad UTF-8)."""

    message: str
    size: int
    reason: str


def _tolerant(parse: Callable[[bytes], Any], message: str) -> Callable[[bytes], Any]:
    """A request deserializer that never raises: what does not parse becomes an Unparsed."""
    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except (DecodeError, UnicodeDecodeError) as exc:
            return Unparsed(message, len(data), str(exc).rpartition(": ")[2] or type(exc).__name__)

    return deserialize


def _parsed(request: Any) -> Any:
    """The request itself, or InvalidInput (through the error table: INVALID_ARGUMENT) for an Unparsed."""
    if isinstance(request, Unparsed):
        log.info("malformed_request", message=request.message, bytes=request.size, reason=request.reason)
        raise InvalidInput(f"the request is not a valid {request.message}: {request.reason}",
                           reason="MALFORMED_REQUEST")
    return request


async def _each_parsed(requests: AsyncIterator[Any]) -> AsyncGenerator[Any, None]:
    async for request in requests:
        yield _parsed(request)


def _strict(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """`handler` with a tolerant deserializer and a behavior that refuses what did not parse.

    The refusal is raised inside the behavior, so the interceptor (auth, the drain gate,
    request ids, metrics) sees it like any handler's error. A streaming behavior stays a
    transparent async generator: what it yields, and closing it, reach the handler as they are.
    """
    if handler.unary_unary is not None:
        unary = handler.unary_unary

        async def unary_unary(request: Any, context: Any) -> Any:
            return await unary(_parsed(request), context)

        changes: dict[str, Any] = {"unary_unary": unary_unary}
    elif handler.unary_stream is not None:
        streamed = handler.unary_stream

        async def unary_stream(request: Any, context: Any) -> AsyncGenerator[Any, None]:
            async with aclosing(streamed(_parsed(request), context)) as responses:
                async for response in responses:
                    yield response

        changes = {"unary_stream": unary_stream}
    else:
        both = handler.stream_stream

        async def stream_stream(requests: AsyncIterator[Any], context: Any) -> AsyncGenerator[Any, None]:
            parsed = _each_parsed(requests)
            async with aclosing(parsed), aclosing(both(parsed, context)) as responses:
                async for response in responses:
                    yield response

        changes = {"stream_stream": stream_stream}
    deserializer = _tolerant(handler.request_deserializer, message)
    return handler._replace(request_deserializer=deserializer, **changes)  # type: ignore[attr-defined, no-any-return]


class _Handlers:
    """Stands in for a server to collect the method handlers the generated code registers."""

    def __init__(self) -> None:
        self.methods: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass

    def add_registered_method_handlers(self, service: str, methods: dict[str, grpc.RpcMethodHandler]) -> None:
        self.methods = methods


def add_ladder_service(servicer: LadderServicer, server: grpc.aio.Server) -> None:
    """Register the Ladder service as the generated code does, but tolerant of bytes that do not parse.

    gRPC itself ends such a call with UNKNOWN (INTERNAL for Prefill) and no log line;
    here it is InvalidInput, INVALID_ARGUMENT through the error table, logged.
    """
    collected = _Handlers()
    ladder_pb2_grpc.add_LadderServicer_to_server(servicer, collected)
    service = ladder_pb2.DESCRIPTOR.services_by_name["Ladder"]
    methods = {name: _strict(handler, service.methods_by_name[name].input_type.name)
               for name, handler in collected.methods.items()}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, methods),))
    server.add_registered_method_handlers(SERVICE_NAME, methods)


def load_model(config: Config) -> ServedModel:
    """The engine and tokenizer of config.model ("default": prepared under config.model_cache)."""
    if config.model == "default":
        from engine.default_model import prepare

        path = prepare(Path(config.model_cache), precision=config.default_model_precision).model_dir
    else:
        path = Path(config.model)
    engine = Engine.load(path, config.engine_options())
    if config.warm_up:
        started = time.perf_counter()
        prepared = engine.warm_up()
        log.info("warmed_up", variants=prepared, seconds=round(time.perf_counter() - started, 3))
    # onnxruntime-extensions' native module has aborted the process when first imported
    # from this (model-loading) thread, so engine.tokenizer is imported with this module.
    return ServedModel(engine, read_tokenizer(path), str(path), config.max_prompt_tokens,
                       config.max_new_tokens, config.default_max_new_tokens)


def read_tokenizer(path: Path) -> Tokenizer | None:
    """The model's tokenizer; None (token-id prompts only, said once in the log) when it has
    none Ladder can read."""
    if not (path / "tokenizer.json").exists():
        log.warning("no_tokenizer", model=str(path), serving="token-id prompts only")
        return None
    try:
        return Tokenizer(path)
    except Exception as exc:  # noqa: BLE001 — whatever its files hold, the model still serves token ids
        reason = str(exc) if isinstance(exc, TokenizerUnreadable) else f"{type(exc).__name__}: {exc}"
        log.warning("tokenizer_unreadable", model=str(path), reason=reason,
                    serving="token-id prompts only: text, chat, Tokenize and Detokenize fail")
        return None


class LadderServer:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.metrics = Metrics()
        self.health = health.aio.HealthServicer()
        self.serving: Serving | None = None  # once the model has loaded
        self.servicer = LadderServicer(self._serving)
        self.draining = False
        self.interceptor = CallInterceptor(config.auth_tokens, self._gate, self.metrics.call_done,
                                           on_internal=self._fault,
                                           max_message_bytes=config.max_message_bytes)
        # gRPC's own receive limit sits above ours, so a request up to twice the limit gets our
        # answer (INVALID_ARGUMENT, MESSAGE_TOO_LARGE, logged and counted); beyond that gRPC's own.
        limits = [("grpc.max_receive_message_length", 2 * config.max_message_bytes),
                  ("grpc.max_send_message_length", config.max_message_bytes),
                  ("grpc.so_reuseport", 0)]  # a port another server holds fails here, not shared
        self.grpc = grpc.aio.server(interceptors=[self.interceptor], options=limits)
        self.port = 0
        self._tasks: list[asyncio.Task[Any]] = []
        self._http: Any = None
        self.fault: BaseException | None = None
        self.stopped = asyncio.Event()

    def _gate(self) -> None:
        if self.draining:
            raise Draining("the server is draining; retry on another replica")
        self._serving()

    def _serving(self) -> Serving:
        """What the servicer's calls share; none before the model has loaded (the gate refuses the call)."""
        if self.serving is None:
            raise Draining("the server is loading its model; retry shortly", reason="MODEL_LOADING")
        return self.serving

    async def start(self) -> int:
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc)
        add_ladder_service(self.servicer, self.grpc)
        documented_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), self.grpc)
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        address = f"{self.config.host}:{self.config.port}"
        credentials = server_credentials(self.config)
        what = "gRPC port (--port/LADDER_PORT)"
        check_port_free(self.config.host, self.config.port, what)
        try:
            self.port = (self.grpc.add_secure_port(address, credentials) if credentials
                         else self.grpc.add_insecure_port(address))
        except RuntimeError as exc:  # taken between the check and the bind
            raise PortInUse(f"{what} {self.config.port} on {self.config.host} could not be bound: "
                            f"{exc}") from None
        await self.grpc.start()
        log.info("listening", port=self.port, tls=self.config.tls, auth=self.config.auth)
        return self.port

    async def load(self) -> None:
        model = await asyncio.to_thread(load_model, self.config)
        loop = asyncio.get_running_loop()

        def on_fault(exc: BaseException) -> None:  # called on the worker thread
            loop.call_soon_threadsafe(self._fault, exc)

        scheduler = Scheduler(model.engine, self.config.max_queue, on_fault=on_fault,
                              on_forward=self.metrics.forward_done)
        sessions = SessionRegistry(self.config.pod_name, self.config.sessions_per_caller)
        constraints = Constraints(model.tokenizer, model.facts, self.config.constraint_cache_mb << 20,
                                  self.metrics)
        self.serving = Serving(self.config, model, scheduler, sessions, self.metrics, constraints)
        engine = model.engine
        self.metrics.watch(lambda: scheduler.depth, lambda: len(sessions), lambda: scheduler.waiting,
                           lambda: 1.0 - engine.free_slots / max(1, model.facts.slots))
        self.metrics.describe_model({"model": model.name, "provider": model.facts.provider,
                                     "pod": self.config.pod_name})
        self.metrics.engine_stats(await scheduler.run(Stats()))
        self._tasks.append(asyncio.create_task(self._housekeeping()))
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        log.info("serving", model=model.name, capacity=model.capacity, ladder=model.facts.ladder)

    async def _set_health(self, status: Any) -> None:
        for name in HEALTH_NAMES:
            await self.health.set(name, status)

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
        await self.health.enter_graceful_shutdown()
        log.info("draining", in_flight=self.interceptor.in_flight, grace=grace)
        deadline = time.monotonic() + grace
        while self.interceptor.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if self.serving is not None and self.interceptor.in_flight:
            self.serving.scheduler.abort_all(Draining("the server shut down before the call finished"))
            await asyncio.sleep(0.2)
        await self.stop()

    def start_metrics(self, port: int) -> None:
        """Serve /metrics over HTTP on `port` (0: not at all) until the server stops."""
        what = "metrics port (--metrics-port/LADDER_METRICS_PORT; 0 turns it off)"
        try:
            self._http = self.metrics.serve_http(port)
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
        await self.grpc.stop(grace)
        if self.serving is not None:
            self.serving.scheduler.stop()
        if self._http is not None:
            self._http.shutdown()
        self.stopped.set()
        log.info("stopped")

    async def wait_for_termination(self) -> None:
        await self.grpc.wait_for_termination()


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


def configure_logging(level: str) -> None:
    """JSON lines on stderr, with the request id of the call that logs them."""
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, structlog.processors.add_log_level,
                    structlog.processors.TimeStamper(fmt="iso", utc=True),
                    structlog.processors.format_exc_info, structlog.processors.JSONRenderer()],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr), cache_logger_on_first_use=True)


async def serve(config: Config) -> int:
    """Serve until SIGTERM or SIGINT (then drain gracefully) or an engine fault; the exit code."""
    configure_logging(config.log_level)
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
        await server.load()
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

