"""The one interceptor every Ladder call passes through, and the server's TLS credentials.

It checks the bearer token (when tokens are configured), names the caller and
the request (x-request-id) for the handler and the logs, refuses new work while
draining, and turns whatever a handler raises into its status through the table
in service/errors.py. A call the client cancelled, or whose deadline passed,
or whose client went away, is counted and logged as CANCELLED or
DEADLINE_EXCEEDED. Every call ends in one access-log line: `rpc` when it
succeeded, `rpc_failed` or `rpc_cancelled` (rate-limited per method and code)
when not, each with the request id, method, caller, peer, session, prompt and
completion tokens, queue time, TTFT, duration, status code and finish reason
(the handler fills in a CallRecord as it goes). Health and reflection pass
untouched: probes carry no token.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import hmac
import time
import traceback
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import structlog

from service.config import Config
from service.errors import TooLarge, Unauthenticated, status_for
from service.sessions import plain_id

log = structlog.get_logger("ladder.rpc")
CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("ladder_caller", default="")
REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("ladder_request_id", default="")


@dataclass
class CallRecord:
    """What one call's access-log line reports; its handler fills in the session and progress."""

    method: str
    arrived: float
    peer: str = ""
    session: str = ""
    source_session: str = ""  # ForkSession: the session forked
    progress: Any = None  # service.progress.Progress of a generation or prefill

    def fields(self) -> dict[str, Any]:
        """The access-log fields beyond method, code and request id."""
        done: dict[str, Any] = {"caller": CALLER.get(), "peer": self.peer,
                                "duration_ms": round((time.perf_counter() - self.arrived) * 1000.0, 3)}
        if self.session:
            done["session"] = self.session
        if self.source_session:
            done["source_session"] = self.source_session
        progress = self.progress
        if progress is not None:
            done.update(prompt_tokens=progress.prompt_tokens, completion_tokens=progress.generated)
            if progress.started is not None:
                done["queue_ms"] = round(progress.queue_ms, 3)
            if progress.token_times:
                done["ttft_ms"] = round(progress.ttft_ms, 3)
            elif self.method == "Prefill" and progress.ended is not None:
                # PrefillDone carries the prompt's next token: arrival to it, as the TTFT metric.
                done["ttft_ms"] = round((progress.ended - progress.arrived) * 1000.0, 3)
            if progress.finished is not None:
                done["finish_reason"] = progress.finished.reason.name.lower()
            elif progress.ending:
                done["finish_reason"] = progress.ending
        return done


CALL: contextvars.ContextVar[CallRecord | None] = contextvars.ContextVar("ladder_call", default=None)
LADDER_PREFIX = "/ladder.v1.Ladder/"
FAILURE_LINES_PER_SECOND = 5
# A call cancelled this close to its deadline was ended by it (gRPC's deadline timer and the
# wall clock time_remaining() reads may disagree by a little).
DEADLINE_SLACK_S = 0.05


def caller_tokens(tokens: tuple[str, ...]) -> dict[str, str]:
    """token -> caller name: "name=token" names its caller, a bare token is named by its hash."""
    named = {}
    for entry in tokens:
        name, eq, token = entry.partition("=")
        if not eq:
            name, token = "token-" + hashlib.sha256(entry.encode()).hexdigest()[:12], entry
        named[token] = name
    return named


def server_credentials(config: Config) -> grpc.ServerCredentials | None:
    """TLS from the certificate and key; a client CA makes it mutual TLS."""
    if not config.tls:
        return None
    pair = (Path(config.tls_key).read_bytes(), Path(config.tls_cert).read_bytes())
    ca = Path(config.tls_client_ca).read_bytes() if config.tls_client_ca else None
    return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=ca is not None)


def _certificate_name(context: grpc.aio.ServicerContext) -> str:
    """Under mutual TLS without tokens, the client certificate's common name is the caller."""
    names = (context.auth_context() or {}).get("x509_common_name") or []
    return "cn:" + names[0].decode() if names else ""


@dataclass
class _Window:
    start: float
    lines: int = 0
    left_out: int = 0


class FailureLog:
    """At most `per_second` log lines a second for each (method, code); the next line that is
    written says how many were left out before it (`suppressed`)."""

    def __init__(self, per_second: int = FAILURE_LINES_PER_SECOND,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.per_second = per_second
        self.clock = clock
        self._windows: dict[tuple[str, str], _Window] = {}

    def admit(self, method: str, code: str) -> int | None:
        """None: leave this line out; else how many lines of this kind were left out before it."""
        now = self.clock()
        window = self._windows.setdefault((method, code), _Window(now))
        if now - window.start >= 1.0:
            window.start, window.lines = now, 0
        if window.lines >= self.per_second:
            window.left_out += 1
            return None
        window.lines += 1
        left_out, window.left_out = window.left_out, 0
        return left_out

    def write(self, event: str, method: str, code: grpc.StatusCode, **fields: Any) -> None:
        left_out = self.admit(method, code.name)
        if left_out is None:
            return
        if left_out:
            fields["suppressed"] = left_out
        write = log.error if code == grpc.StatusCode.INTERNAL else log.info
        write(event, method=method, code=code.name, **fields)


def _access_fields() -> dict[str, Any]:
    record = CALL.get()
    return record.fields() if record is not None else {}


def ending_code(context: grpc.aio.ServicerContext) -> grpc.StatusCode:
    """How a call that stopped under its handler ended: its deadline passed, or the client left."""
    remaining = context.time_remaining()
    if remaining is not None and remaining <= DEADLINE_SLACK_S:
        return grpc.StatusCode.DEADLINE_EXCEEDED
    return grpc.StatusCode.CANCELLED


class CallInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, tokens: tuple[str, ...], gate: Callable[[], None],
                 on_done: Callable[[str, grpc.StatusCode, float], None],
                 on_internal: Callable[[BaseException], None] | None = None,
                 max_message_bytes: int = 0) -> None:
        self.tokens = caller_tokens(tokens)
        # Requests over it fail here, logged and counted (gRPC's own limit is set above it:
        # server.py); 0 = no check of our own.
        self.max_message_bytes = max_message_bytes
        self.gate = gate  # raises (Draining) while the server takes no new work
        self.on_done = on_done
        self.on_internal = on_internal  # an error no table entry explains: the server can't be trusted
        self.in_flight = 0
        self.failures = FailureLog()

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        method = details.method
        if handler is None or not method.startswith(LADDER_PREFIX):
            return handler
        name = method.removeprefix(LADDER_PREFIX)
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=self._unary(name, handler.unary_unary))
        if handler.unary_stream is not None:
            return handler._replace(unary_stream=self._stream(name, handler.unary_stream))
        return handler._replace(stream_stream=self._stream(name, handler.stream_stream))

    def _enter(self, name: str, context: grpc.aio.ServicerContext) -> float:
        arrived = time.perf_counter()
        CALL.set(CallRecord(name, arrived, peer=context.peer() or ""))
        metadata: Mapping[str, str | bytes] = dict(context.invocation_metadata() or ())
        asked = str(metadata.get("x-request-id") or "")
        # An id that could not name a session (too long, odd characters) is never echoed into logs
        # and trailers: the call gets one of the server's own instead.
        request_id = asked if asked and plain_id(asked) else uuid.uuid4().hex[:16]
        REQUEST_ID.set(request_id)
        structlog.contextvars.bind_contextvars(request_id=request_id, method=name)
        context.set_trailing_metadata((("x-request-id", request_id),))
        self.gate()
        CALLER.set(self._caller(metadata) or _certificate_name(context))
        return arrived

    def _caller(self, metadata: Mapping[str, str | bytes]) -> str:
        if not self.tokens:
            return ""
        header = str(metadata.get("authorization", ""))
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("missing bearer token (metadata authorization: Bearer <token>)",
                                  reason="TOKEN_MISSING")
        for known, name in self.tokens.items():
            if hmac.compare_digest(known.encode(), token.strip().encode()):
                return name
        raise Unauthenticated("unknown bearer token", reason="TOKEN_UNKNOWN")

    async def _fail(self, name: str, context: grpc.aio.ServicerContext, error: BaseException,
                    started: float) -> None:
        status = status_for(error)
        if status.code == grpc.StatusCode.INTERNAL:
            log.error("internal_error", method=name, request_id=REQUEST_ID.get(), error=repr(error),
                      traceback="".join(traceback.format_exception(error)))
            if self.on_internal is not None:
                self.on_internal(error)
        self._done(name, status.code, started)
        self.failures.write("rpc_failed", name, status.code, request_id=REQUEST_ID.get(),
                            details=status.details, **_access_fields())
        metadata = (("x-request-id", REQUEST_ID.get()), *status.trailing_metadata)
        await context.abort(status.code, status.details, metadata)

    def _left(self, name: str, context: grpc.aio.ServicerContext, request_id: str, started: float) -> None:
        """The call stopped under its handler: the client cancelled or went away, or its deadline passed."""
        code = ending_code(context)
        self._done(name, code, started)
        self.failures.write("rpc_cancelled", name, code, request_id=request_id, **_access_fields())

    def _done(self, name: str, code: grpc.StatusCode, started: float) -> None:
        record = CALL.get()
        if record is not None and record.progress is not None:
            record.progress.end(code)  # samples the call's ending cut short count with its reason
        self.on_done(name, code, time.perf_counter() - started)

    def _check_size(self, message: Any) -> None:
        limit = self.max_message_bytes
        # Not a message (bytes the deserializer could not parse): the handler refuses it.
        if limit and hasattr(message, "ByteSize") and message.ByteSize() > limit:
            raise TooLarge(f"the request message is {message.ByteSize()} bytes, over the limit of {limit} "
                           "bytes (--max-message-bytes)", reason="MESSAGE_TOO_LARGE",
                           metadata={"limit_bytes": str(limit), "bytes": str(message.ByteSize())})

    async def _checked(self, messages: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for message in messages:
            self._check_size(message)
            yield message

    def _unary(self, name: str, behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            started = time.perf_counter()
            self.in_flight += 1
            try:
                started = self._enter(name, context)
                self._check_size(request)
                response = await behavior(request, context)
            except grpc.aio.AbortError:
                raise
            except asyncio.CancelledError:
                self._left(name, context, REQUEST_ID.get(), started)
                raise
            except Exception as exc:  # noqa: BLE001 — every failure goes through the table
                await self._fail(name, context, exc, started)
            finally:
                self.in_flight -= 1
            self._done(name, grpc.StatusCode.OK, started)
            log.info("rpc", method=name, code="OK", request_id=REQUEST_ID.get(), **_access_fields())
            return response

        return unary

    def _stream(self, name: str,
                behavior: Callable[..., AsyncGenerator[Any, None]]) -> Callable[..., AsyncIterator[Any]]:
        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            started, request_id = time.perf_counter(), ""
            self.in_flight += 1
            streamed = hasattr(request, "__aiter__")  # a request stream: each message checked as it comes
            responses = behavior(self._checked(request) if streamed else request, context)
            try:
                started = self._enter(name, context)
                request_id = REQUEST_ID.get()
                if not streamed:
                    self._check_size(request)
                async for response in responses:
                    yield response
            except grpc.aio.AbortError:
                raise
            except (asyncio.CancelledError, GeneratorExit):
                # GeneratorExit: gRPC could not write a response (the call has ended) and closed us.
                self._left(name, context, request_id, started)
                raise
            except Exception as exc:  # noqa: BLE001 — every failure goes through the table
                await self._fail(name, context, exc, started)
            else:
                self._done(name, grpc.StatusCode.OK, started)
                log.info("rpc", method=name, code="OK", request_id=request_id, **_access_fields())
            finally:
                self.in_flight -= 1
                await responses.aclose()  # the handler's clean-up runs now, not when it is collected

        return stream
