"""The access log: every Ladder call gets a request id, is counted in flight, and ends in one line.

The id is the caller's x-request-id when it could name a session, else one of the server's own;
it is bound into every log line of the call and sent back in the trailers. The line is `rpc` when
the call succeeded, `rpc_failed` when it failed (`failed`, told by the status table before the
status goes out) and `rpc_cancelled` when the client cancelled or went away or the deadline
passed (CANCELLED or DEADLINE_EXCEEDED); the last two are rate-limited per method and code. Each
line carries the request id, method, caller, peer, session, prompt and completion tokens, queue
time, TTFT, duration, status code and finish reason (the handler's CallRecord), and each ending
is counted once (`on_done`).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import structlog

from service.calls import plain_id
from service.errors import Status
from service.interceptors.base import Context, LadderInterceptor, Stream, Unary
from service.interceptors.call_context import CALL, REQUEST_ID, CallRecord

log = structlog.get_logger("ladder.rpc")
FAILURE_LINES_PER_SECOND = 5
DRAIN_POLL_S = 0.02  # how often a drain looks at the calls in flight
# A call cancelled this close to its deadline was ended by it (gRPC's deadline timer and the
# wall clock time_remaining() reads may disagree by a little).
DEADLINE_SLACK_S = 0.05


@dataclass
class _Window:
    start: float
    lines: int = 0
    left_out: int = 0


class FailureLog:
    """At most `per_second` log lines a second for each (method, code); the next line that is
    written says how many were left out before it (`suppressed`)."""

    def __init__(
        self, per_second: int = FAILURE_LINES_PER_SECOND, clock: Callable[[], float] = time.monotonic
    ) -> None:
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


def ending_code(context: Context) -> grpc.StatusCode:
    """How a call that stopped under its handler ended: its deadline passed, or the client left."""
    remaining = context.time_remaining()
    if remaining is not None and remaining <= DEADLINE_SLACK_S:
        return grpc.StatusCode.DEADLINE_EXCEEDED
    return grpc.StatusCode.CANCELLED


def _protocol(protocol: str) -> dict[str, str]:
    """The line's `protocol` field: named for HTTP calls only (gRPC's lines are as they were)."""
    return {} if protocol == "grpc" else {"protocol": protocol}


def _access_fields() -> dict[str, Any]:
    record = CALL.get()
    return record.fields() if record is not None else {}


def _name_the_call(name: str, context: Context) -> None:
    """Start the call's record and give it its request id (logs, trailers)."""
    metadata: Mapping[str, str | bytes] = dict(context.invocation_metadata() or ())
    request_id = start_call(name, context.peer() or "", str(metadata.get("x-request-id") or ""))
    context.set_trailing_metadata((("x-request-id", request_id),))


def start_call(name: str, peer: str, asked: str) -> str:
    """Start the call's record (gRPC or HTTP) and give it its request id: `asked`, the client's own,
    when it could name a session, else one of the server's."""
    CALL.set(CallRecord(name, time.perf_counter(), peer=peer))
    # An id that could not name a session (too long, odd characters) is never echoed into logs
    # and trailers: the call gets one of the server's own instead.
    request_id = asked if asked and plain_id(asked) else uuid.uuid4().hex[:16]
    REQUEST_ID.set(request_id)
    structlog.contextvars.bind_contextvars(request_id=request_id, method=name)
    return request_id


class AccessLog(LadderInterceptor):
    """The outermost interceptor: `in_flight` counts every Ladder call, refused ones included."""

    def __init__(self, on_done: Callable[[str, grpc.StatusCode, float, str], None]) -> None:
        self.on_done = on_done  # (method, code, seconds, protocol): once per call
        self.in_flight = 0  # gRPC and HTTP calls: the drain waits for both
        self.failures = FailureLog()

    async def settled(self, grace: float) -> int:
        """Wait up to `grace` seconds for the calls in flight to end (a drain's wait); how many have not."""
        deadline = time.monotonic() + grace
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        return self.in_flight

    def failed(self, name: str, status: Status, protocol: str = "grpc") -> None:
        """The call ends with `status`: count it and write its `rpc_failed` line."""
        self._done(name, status.code, protocol)
        self.failures.write(
            "rpc_failed",
            name,
            status.code,
            request_id=REQUEST_ID.get(),
            details=status.details,
            **_protocol(protocol),
            **_access_fields(),
        )

    def _left(self, name: str, context: Context, request_id: str) -> None:
        """The call stopped under its handler: the client cancelled or went away, or its deadline passed."""
        self.left(name, ending_code(context), request_id)

    def left(self, name: str, code: grpc.StatusCode, request_id: str, protocol: str = "grpc") -> None:
        self._done(name, code, protocol)
        self.failures.write(
            "rpc_cancelled", name, code, request_id=request_id, **_protocol(protocol), **_access_fields()
        )

    def succeeded(self, name: str, request_id: str, protocol: str = "grpc") -> None:
        self._done(name, grpc.StatusCode.OK, protocol)
        log.info(
            "rpc", method=name, code="OK", request_id=request_id, **_protocol(protocol), **_access_fields()
        )

    def _done(self, name: str, code: grpc.StatusCode, protocol: str) -> None:
        record = CALL.get()
        for progress in record.progresses if record is not None else ():
            progress.end(code)  # samples the call's ending cut short count with its reason
        now = time.perf_counter()
        self.on_done(name, code, now - (record.arrived if record is not None else now), protocol)

    def unary(self, name: str, behavior: Unary) -> Unary:
        async def unary(request: Any, context: Context) -> Any:
            self.in_flight += 1
            try:
                _name_the_call(name, context)
                response = await behavior(request, context)
            except grpc.aio.AbortError:
                raise  # ended with its status, already counted and logged (`failed`)
            except asyncio.CancelledError:
                self._left(name, context, REQUEST_ID.get())
                raise
            finally:
                self.in_flight -= 1
            self.succeeded(name, REQUEST_ID.get())
            return response

        return unary

    def stream(self, name: str, behavior: Stream) -> Stream:
        async def stream(request: Any, context: Context) -> AsyncGenerator[Any, None]:
            request_id = ""
            self.in_flight += 1
            responses = behavior(request, context)
            try:
                _name_the_call(name, context)
                request_id = REQUEST_ID.get()
                async for response in responses:
                    yield response
            except grpc.aio.AbortError:
                raise  # ended with its status, already counted and logged (`failed`)
            except (asyncio.CancelledError, GeneratorExit):
                # GeneratorExit: gRPC could not write a response (the call has ended) and closed us.
                self._left(name, context, request_id)
                raise
            else:
                self.succeeded(name, request_id)
            finally:
                self.in_flight -= 1
                await responses.aclose()  # the handler's clean-up runs now, not when it is collected

        return stream
