"""The status table at work: a Ladder call that fails ends with its error's status, and nothing else.

While the server drains or loads its model, `gate` refuses new calls (Draining: UNAVAILABLE).
Whatever a handler, the token check or the gate raises is looked up in the table in
service/errors.py and the call is aborted with that status, its rich details and the request
id in the trailers. `on_failure` hears of it first, so the call's access line and metric are
written before the client can see the status. An error no table entry explains (INTERNAL) is
logged with its traceback and fails that call alone: only the engine's own faults drain the server
(the scheduler reports those, service/worker/scheduler.py).
"""

from __future__ import annotations

import traceback
from collections.abc import AsyncGenerator, Callable
from typing import Any, NoReturn

import grpc
import structlog

from service.door.call_context import REQUEST_ID
from service.errors import Status, status_for
from service.interceptors.base import Context, LadderInterceptor, Stream, Unary

log = structlog.get_logger("ladder.rpc")


class StatusTable(LadderInterceptor):
    def __init__(self, gate: Callable[[], None], on_failure: Callable[[str, Status], None]) -> None:
        self.gate = gate  # raises (Draining) while the server takes no new work
        self.on_failure = on_failure  # (method, status): before the status is sent

    async def _fail(self, name: str, context: Context, error: Exception) -> NoReturn:
        status = status_for(error)
        if status.code == grpc.StatusCode.INTERNAL:
            log.error(
                "internal_error",
                method=name,
                request_id=REQUEST_ID.get(),
                error=repr(error),
                traceback="".join(traceback.format_exception(error)),
            )
        self.on_failure(name, status)
        metadata = (("x-request-id", REQUEST_ID.get()), *status.trailing_metadata)
        await context.abort(status.code, status.details, metadata)
        raise AssertionError("context.abort raises")

    def unary(self, name: str, behavior: Unary) -> Unary:
        async def unary(request: Any, context: Context) -> Any:
            try:
                self.gate()
                return await behavior(request, context)
            except grpc.aio.AbortError:
                raise
            except Exception as exc:  # noqa: BLE001 — every failure goes through the table
                await self._fail(name, context, exc)

        return unary

    def stream(self, name: str, behavior: Stream) -> Stream:
        async def stream(request: Any, context: Context) -> AsyncGenerator[Any, None]:
            responses = behavior(request, context)
            try:
                self.gate()
                async for response in responses:
                    yield response
            except grpc.aio.AbortError:
                raise
            except Exception as exc:  # noqa: BLE001 — every failure goes through the table
                await self._fail(name, context, exc)
            finally:
                await responses.aclose()

        return stream
