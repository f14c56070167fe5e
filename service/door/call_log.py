"""The call log: every call, gRPC or HTTP, is counted in flight and ends in one line and one metric.

The line is `rpc` when the call succeeded, `rpc_failed` when it failed (`failed`, told by the status
table or the HTTP app's error path before the status goes out) and `rpc_cancelled` when the client
cancelled or went away or the deadline passed (CANCELLED or DEADLINE_EXCEEDED); the last two are
rate-limited per method and code. Each line carries the request id, method, caller, peer, session,
prompt and completion tokens, queue time, TTFT, duration, status code and finish reason (the
handler's CallRecord), and each ending is counted once (`on_done`). gRPC's access-log interceptor
(service/interceptors/access_log.py) and the HTTP app's middleware tell it how calls end.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc
import structlog

from service.door.call_context import CALL, REQUEST_ID
from service.errors import Status

log = structlog.get_logger("ladder.rpc")
FAILURE_LINES_PER_SECOND = 5
DRAIN_POLL_S = 0.02  # how often a drain looks at the calls in flight


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


def _protocol(protocol: str) -> dict[str, str]:
    """The line's `protocol` field: named for HTTP calls only (gRPC's lines are as they were)."""
    return {} if protocol == "grpc" else {"protocol": protocol}


def _access_fields() -> dict[str, Any]:
    record = CALL.get()
    return record.fields() if record is not None else {}


class CallLog:
    """The calls in flight (gRPC and HTTP: a drain waits for both) and how each one ended."""

    def __init__(self, on_done: Callable[[str, grpc.StatusCode, float, str], None]) -> None:
        self.on_done = on_done  # (method, code, seconds, protocol): once per call
        self.in_flight = 0
        self.failures = FailureLog()

    @contextmanager
    def counted(self) -> Iterator[None]:
        """A call in flight while the block runs."""
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

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

    def left(self, name: str, code: grpc.StatusCode, request_id: str, protocol: str = "grpc") -> None:
        """The call stopped under its handler: the client cancelled or went away, or its deadline passed."""
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
