"""What the door tells a handler about the call it serves, through context variables.

`CALLER` is set by the token check (callers.py), `REQUEST_ID` and `CALL` when the call starts
(`start_call`, from gRPC's access-log interceptor or the HTTP app's middleware); the handler fills in
its `CallRecord` (session, progress) as it goes, and the call log's line reports it when the call
ends (call_log.py).
"""

from __future__ import annotations

import contextvars
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import structlog

from service.calls import plain_id

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
    progress: Any = None  # service.front.progress.Progress of a generation or prefill
    # The Progress of each further prompt of the call (an HTTP completions request with several).
    more: list[Any] = field(default_factory=list)

    def add_progress(self, progress: Any) -> None:
        """The call's (first) generation's Progress, or one more prompt's."""
        if self.progress is None:
            self.progress = progress
        else:
            self.more.append(progress)

    @property
    def progresses(self) -> list[Any]:
        return ([] if self.progress is None else [self.progress]) + self.more

    def fields(self) -> dict[str, Any]:
        """The access-log fields beyond method, code and request id."""
        done: dict[str, Any] = {
            "caller": CALLER.get(),
            "peer": self.peer,
            "duration_ms": round((time.perf_counter() - self.arrived) * 1000.0, 3),
        }
        if self.session:
            done["session"] = self.session
        if self.source_session:
            done["source_session"] = self.source_session
        progress = self.progress
        if progress is not None:
            done.update(
                prompt_tokens=sum(p.prompt_tokens for p in self.progresses),
                completion_tokens=sum(p.generated for p in self.progresses),
            )
            if self.more:
                done["prompts"] = 1 + len(self.more)
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
