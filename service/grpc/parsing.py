"""The Ladder service as registered: requests parsed and sized inside the call, never before it.

gRPC itself ends a call whose bytes do not parse with UNKNOWN (INTERNAL for Prefill) and no log
line. Here a tolerant deserializer turns them into an `Unparsed`, and each handler refuses one
(InvalidInput, MALFORMED_REQUEST) or a message over `--max-message-bytes` (TooLarge,
MESSAGE_TOO_LARGE) as its first step, so the interceptors (service/interceptors/) see the
refusal like any handler's error: after the drain gate and the token check, logged and counted.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import grpc
import structlog
from google.protobuf.message import DecodeError

from engine.errors import InvalidInput
from proto.ladder.v1 import ladder_pb2, ladder_pb2_grpc
from service.errors import TooLarge
from service.interceptors.base import Stream, Unary

log = structlog.get_logger("ladder.server")
SERVICE_NAME = ladder_pb2.DESCRIPTOR.services_by_name["Ladder"].full_name


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


def _accepted(request: Any, limit: int) -> Any:
    """The request itself; InvalidInput for an Unparsed, TooLarge for a message over `limit` bytes
    (0: no limit of ours). Both become their status through the error table."""
    if isinstance(request, Unparsed):
        log.info("malformed_request", message=request.message, bytes=request.size, reason=request.reason)
        raise InvalidInput(
            f"the request is not a valid {request.message}: {request.reason}", reason="MALFORMED_REQUEST"
        )
    if limit and request.ByteSize() > limit:
        size = request.ByteSize()
        raise TooLarge(
            f"the request message is {size} bytes, over the limit of {limit} bytes (--max-message-bytes)",
            reason="MESSAGE_TOO_LARGE",
            metadata={"limit_bytes": str(limit), "bytes": str(size)},
        )
    return request


async def _each_accepted(requests: AsyncIterator[Any], limit: int) -> AsyncGenerator[Any, None]:
    async for request in requests:
        yield _accepted(request, limit)


def _strict(
    handler: grpc.RpcMethodHandler[Any, Any], message: str, limit: int
) -> grpc.RpcMethodHandler[Any, Any]:
    """`handler` with a tolerant deserializer and a behavior that first refuses what `_accepted` refuses.

    A streaming behavior stays a transparent async generator: what it yields, and closing it,
    reach the handler as they are; a request stream is checked message by message as the
    handler reads it.
    """
    assert handler.request_deserializer is not None  # the generated code gives every method one
    parse, serialize = _tolerant(handler.request_deserializer, message), handler.response_serializer
    # types-grpcio types a streaming behavior as the sync server calls it (an Iterator); under
    # grpc.aio it is an async generator function, as `Stream` says.
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(_unary_unary(handler.unary_unary, limit), parse, serialize)
    if handler.unary_stream is not None:
        unary_stream = _unary_stream(handler.unary_stream, limit)  # type: ignore[arg-type]
        return grpc.unary_stream_rpc_method_handler(unary_stream, parse, serialize)
    assert handler.stream_stream is not None  # Ladder has no client-streaming unary method
    stream_stream = _stream_stream(handler.stream_stream, limit)  # type: ignore[arg-type]
    return grpc.stream_stream_rpc_method_handler(stream_stream, parse, serialize)


def _unary_unary(behavior: Unary, limit: int) -> Unary:
    async def unary_unary(request: Any, context: Any) -> Any:
        return await behavior(_accepted(request, limit), context)

    return unary_unary


def _unary_stream(behavior: Stream, limit: int) -> Stream:
    async def unary_stream(request: Any, context: Any) -> AsyncGenerator[Any, None]:
        async with aclosing(behavior(_accepted(request, limit), context)) as responses:
            async for response in responses:
                yield response

    return unary_stream


def _stream_stream(behavior: Stream, limit: int) -> Stream:
    async def stream_stream(requests: AsyncIterator[Any], context: Any) -> AsyncGenerator[Any, None]:
        accepted = _each_accepted(requests, limit)
        async with aclosing(accepted), aclosing(behavior(accepted, context)) as responses:
            async for response in responses:
                yield response

    return stream_stream


class _Handlers:
    """Stands in for a server to collect the method handlers the generated code registers."""

    def __init__(self) -> None:
        self.methods: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass

    def add_registered_method_handlers(
        self, service: str, methods: dict[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        self.methods = methods


def add_ladder_service(
    servicer: ladder_pb2_grpc.LadderServicer, server: grpc.aio.Server, max_message_bytes: int
) -> None:
    """Register the Ladder service as the generated code does, but with handlers that refuse
    bytes that do not parse and messages over `max_message_bytes` inside the call."""
    collected = _Handlers()
    ladder_pb2_grpc.add_LadderServicer_to_server(servicer, collected)  # type: ignore[arg-type]  # a stand-in server
    service = ladder_pb2.DESCRIPTOR.services_by_name["Ladder"]
    methods = {
        name: _strict(handler, service.methods_by_name[name].input_type.name, max_message_bytes)
        for name, handler in collected.methods.items()
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, methods),))
    server.add_registered_method_handlers(SERVICE_NAME, methods)
