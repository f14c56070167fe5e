"""What the three interceptors share: only the Ladder service's own methods are wrapped.

Health and reflection pass untouched (probes carry no token, and are neither logged nor counted).
A subclass says how it wraps a unary behavior and a streaming one (server streaming, or a request
stream too); each wrapper must be an `async def` or an async generator, as grpc.aio runs anything
else on its thread pool.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

import grpc

LADDER_PREFIX = "/ladder.v1.Ladder/"
Unary = Callable[[Any, Any], Awaitable[Any]]
Stream = Callable[[Any, Any], AsyncGenerator[Any, None]]
# The wrappers never read or write messages through the context, so its message types stay open.
Context = grpc.aio.ServicerContext[Any, Any]


class LadderInterceptor(grpc.aio.ServerInterceptor):
    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], details: grpc.HandlerCallDetails
    ) -> Any:
        handler = await continuation(details)
        method: str = details.method
        if handler is None or not method.startswith(LADDER_PREFIX):
            return handler
        name = method.removeprefix(LADDER_PREFIX)
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=self.unary(name, handler.unary_unary))
        if handler.unary_stream is not None:
            return handler._replace(unary_stream=self.stream(name, handler.unary_stream))
        return handler._replace(stream_stream=self.stream(name, handler.stream_stream))

    def unary(self, name: str, behavior: Unary) -> Unary:
        """`behavior` of method `name` (no prefix), wrapped."""
        raise NotImplementedError

    def stream(self, name: str, behavior: Stream) -> Stream:
        """`behavior` of method `name`, wrapped; closing the wrapper must close `behavior` at once."""
        raise NotImplementedError
