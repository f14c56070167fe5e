"""The access log on gRPC: every Ladder call gets a request id, is counted in flight, and ends in
one line (service/door/call_log.py).

The id is the caller's x-request-id when it could name a session, else one of the server's own;
it is bound into every log line of the call and sent back in the trailers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import grpc

from service.door.call_context import REQUEST_ID, start_call
from service.door.call_log import CallLog
from service.interceptors.base import Context, LadderInterceptor, Stream, Unary

# A call cancelled this close to its deadline was ended by it (gRPC's deadline timer and the
# wall clock time_remaining() reads may disagree by a little).
DEADLINE_SLACK_S = 0.05


def ending_code(context: Context) -> grpc.StatusCode:
    """How a call that stopped under its handler ended: its deadline passed, or the client left."""
    remaining = context.time_remaining()
    if remaining is not None and remaining <= DEADLINE_SLACK_S:
        return grpc.StatusCode.DEADLINE_EXCEEDED
    return grpc.StatusCode.CANCELLED


def _name_the_call(name: str, context: Context) -> None:
    """Start the call's record and give it its request id (logs, trailers)."""
    metadata: Mapping[str, str | bytes] = dict(context.invocation_metadata() or ())
    request_id = start_call(name, context.peer() or "", str(metadata.get("x-request-id") or ""))
    context.set_trailing_metadata((("x-request-id", request_id),))


class AccessLog(CallLog, LadderInterceptor):
    """The outermost interceptor: `in_flight` counts every Ladder call, refused ones included."""

    def unary(self, name: str, behavior: Unary) -> Unary:
        async def unary(request: Any, context: Context) -> Any:
            with self.counted():
                try:
                    _name_the_call(name, context)
                    response = await behavior(request, context)
                except grpc.aio.AbortError:
                    raise  # ended with its status, already counted and logged (`failed`)
                except asyncio.CancelledError:
                    self.left(name, ending_code(context), REQUEST_ID.get())
                    raise
            self.succeeded(name, REQUEST_ID.get())
            return response

        return unary

    def stream(self, name: str, behavior: Stream) -> Stream:
        async def stream(request: Any, context: Context) -> AsyncGenerator[Any, None]:
            request_id = ""
            responses = behavior(request, context)
            with self.counted():
                try:
                    _name_the_call(name, context)
                    request_id = REQUEST_ID.get()
                    async for response in responses:
                        yield response
                except grpc.aio.AbortError:
                    raise  # ended with its status, already counted and logged (`failed`)
                except (asyncio.CancelledError, GeneratorExit):
                    # GeneratorExit: gRPC could not write a response (the call has ended) and closed us.
                    self.left(name, ending_code(context), request_id)
                    raise
                else:
                    self.succeeded(name, request_id)
                finally:
                    await responses.aclose()  # the handler's clean-up runs now, not when it is collected

        return stream
