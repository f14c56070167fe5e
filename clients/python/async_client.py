"""The asyncio Ladder client (grpc.aio): the same methods as `LadderClient`, awaitable.

Streams are async iterators; Prefill takes its prompt parts from a plain or an
async iterable, so a caller can send parts as they become available. Every call
carries the bearer token and a deadline; a stream abandoned early is cancelled.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Sequence
from types import TracebackType
from typing import Any

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2

from clients.python.channel import HEALTH_CHECK, Connection, aio_channel
from clients.python.messages import (
    Constraint,
    Logprobs,
    PromptInput,
    Sampling,
    Stopping,
    Turn,
    decode_request,
    generate_request,
    prefill_request,
    tokenize_request,
)
from proto.ladder.v1 import ladder_pb2 as pb
from proto.ladder.v1 import ladder_pb2_grpc


class AsyncLadderClient:
    """An asyncio channel to one server; use with `async with` or await `close()`."""

    def __init__(self, connection: Connection | str) -> None:
        self.connection = Connection(connection) if isinstance(connection, str) else connection
        self._channel = aio_channel(self.connection)
        self._stub = ladder_pb2_grpc.LadderStub(self._channel)
        # grpc.health.v1 Check, typed (the types-grpcio-health-checking HealthStub declares no methods).
        self._health_check = self._channel.unary_unary(
            HEALTH_CHECK,
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )

    async def __aenter__(self) -> AsyncLadderClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    def _call(self, timeout_s: float | None, request_id: str | None = None) -> dict[str, Any]:
        metadata = self.connection.metadata()
        if request_id:
            metadata += (("x-request-id", request_id),)
        return {"timeout": self.connection.deadline(timeout_s), "metadata": metadata}

    async def generate(
        self,
        prompt: PromptInput,
        *,
        sampling: Sampling | None = None,
        stopping: Stopping | None = None,
        timeout_s: float | None = None,
        request_id: str | None = None,
        n: int = 1,
        logprobs: Logprobs | None = None,
        constraint: Constraint | None = None,
    ) -> pb.Completion:
        """The whole completion; with n > 1 every sample is in `.samples`; with `constraint` every
        sample's text matches it (structured output)."""
        request = generate_request(prompt, sampling, stopping, n, logprobs, constraint)
        result: pb.Completion = await self._stub.Generate(request, **self._call(timeout_s, request_id))
        return result

    async def generate_stream(
        self,
        prompt: PromptInput,
        *,
        sampling: Sampling | None = None,
        stopping: Stopping | None = None,
        timeout_s: float | None = None,
        request_id: str | None = None,
        n: int = 1,
        logprobs: Logprobs | None = None,
        constraint: Constraint | None = None,
        coalesce: bool = False,
    ) -> AsyncIterator[pb.TokenEvent]:
        """One TokenEvent per token (`event.token.sample`: of which sample), then the final Completion.

        With `coalesce`, tokens that were ready together share one event (`event.tokens`; read
        either shape with `messages.tokens_of`)."""
        request = generate_request(prompt, sampling, stopping, n, logprobs, constraint, coalesce)
        call = self._stub.GenerateStream(request, **self._call(timeout_s, request_id))
        async for event in _cancel_when_dropped(call):
            yield event

    async def prefill_stream(
        self,
        parts: Iterable[PromptInput] | AsyncIterable[PromptInput],
        *,
        session_id: str = "",
        sampling: Sampling | None = None,
        timeout_s: float | None = None,
    ) -> AsyncIterator[pb.PrefillEvent]:
        """Stream prompt parts into a new (or the named) session: ForwardEvents, then PrefillDone."""
        call = self._stub.Prefill(_prefill_requests(parts, session_id, sampling), **self._call(timeout_s))
        async for event in _cancel_when_dropped(call):
            yield event

    async def prefill(
        self,
        parts: Iterable[PromptInput] | AsyncIterable[PromptInput],
        *,
        session_id: str = "",
        sampling: Sampling | None = None,
        timeout_s: float | None = None,
    ) -> tuple[list[pb.ForwardEvent], pb.PrefillDone]:
        """Run a whole Prefill; return its forwards and the final PrefillDone."""
        forwards: list[pb.ForwardEvent] = []
        async for event in self.prefill_stream(
            parts, session_id=session_id, sampling=sampling, timeout_s=timeout_s
        ):
            if event.WhichOneof("event") == "done":
                return forwards, event.done
            forwards.append(event.forward)
        raise RuntimeError("Prefill ended without PrefillDone")

    async def decode(
        self,
        session_id: str,
        max_new_tokens: int,
        *,
        sampling: Sampling | None = None,
        stopping: Stopping | None = None,
        timeout_s: float | None = None,
        logprobs: Logprobs | None = None,
        constraint: Constraint | None = None,
        coalesce: bool = False,
    ) -> AsyncIterator[pb.TokenEvent]:
        """Continue the session by up to `max_new_tokens` tokens, streamed; ends with a Completion
        (`coalesce`: as generate_stream's)."""
        request = decode_request(
            session_id, max_new_tokens, sampling, stopping, logprobs, constraint, coalesce
        )
        async for event in _cancel_when_dropped(self._stub.Decode(request, **self._call(timeout_s))):
            yield event

    async def rewind(
        self, session_id: str, length: int, *, timeout_s: float | None = None
    ) -> pb.RewindResponse:
        request = pb.RewindRequest(session_id=session_id, length=length)
        result: pb.RewindResponse = await self._stub.Rewind(request, **self._call(timeout_s))
        return result

    async def close_session(
        self, session_id: str, *, timeout_s: float | None = None
    ) -> pb.CloseSessionResponse:
        request = pb.CloseSessionRequest(session_id=session_id)
        result: pb.CloseSessionResponse = await self._stub.CloseSession(request, **self._call(timeout_s))
        return result

    async def fork_session(
        self, session_id: str, length: int | None = None, *, fork_id: str = "", timeout_s: float | None = None
    ) -> pb.ForkSessionResponse:
        """A new session holding a copy of the first `length` tokens (None: all) of `session_id`.

        With a `fork_id` (chosen, and kept, before the call: a UUID) the fork's id is
        `fork_session_id(session_id, fork_id)` whether or not the answer arrives: retry with the
        same arguments (the fork already made answers) or close that id."""
        request = pb.ForkSessionRequest(session_id=session_id, length=length, fork_id=fork_id)
        result: pb.ForkSessionResponse = await self._stub.ForkSession(request, **self._call(timeout_s))
        return result

    async def tokenize(self, source: str | Sequence[Turn], *, timeout_s: float | None = None) -> list[int]:
        response = await self._stub.Tokenize(tokenize_request(source), **self._call(timeout_s))
        return list(response.ids)

    async def detokenize(self, ids: Sequence[int], *, timeout_s: float | None = None) -> str:
        request = pb.DetokenizeRequest(ids=list(ids))
        response = await self._stub.Detokenize(request, **self._call(timeout_s))
        return str(response.text)

    async def model_info(self, *, timeout_s: float | None = None) -> pb.ModelInfo:
        request = pb.GetModelInfoRequest()
        result: pb.ModelInfo = await self._stub.GetModelInfo(request, **self._call(timeout_s))
        return result

    async def engine_stats(self, *, timeout_s: float | None = None) -> pb.EngineStats:
        request = pb.GetEngineStatsRequest()
        result: pb.EngineStats = await self._stub.GetEngineStats(request, **self._call(timeout_s))
        return result

    async def health(self, service: str = "", *, timeout_s: float | None = None) -> str:
        """The grpc.health.v1 status name: "SERVING", "NOT_SERVING", ..."""
        request = health_pb2.HealthCheckRequest(service=service)
        response = await self._health_check(request, **self._call(timeout_s))
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))

    async def wait_until_serving(self, timeout_s: float, *, service: str = "", poll_s: float = 0.25) -> str:
        """Poll health until SERVING or `timeout_s` passes; return the last status seen."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = min(5.0, max(0.1, deadline - time.monotonic()))
            status = await _health_or_unreachable(self, service, remaining)
            if status == "SERVING" or time.monotonic() + poll_s > deadline:
                return status
            await asyncio.sleep(poll_s)


async def _health_or_unreachable(client: AsyncLadderClient, service: str, timeout_s: float) -> str:
    try:
        return await client.health(service, timeout_s=timeout_s)
    except grpc.aio.AioRpcError as error:
        # Not up yet (connection refused) or still loading: both mean "keep waiting".
        if error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return "UNREACHABLE"
        raise


async def _prefill_requests(
    parts: Iterable[PromptInput] | AsyncIterable[PromptInput], session_id: str, sampling: Sampling | None
) -> AsyncIterator[pb.PrefillRequest]:
    """Send each part as soon as the caller produces it (an async source is not drained first)."""
    index = 0
    async for part in _each(parts):
        yield prefill_request(part, first=index == 0, session_id=session_id, sampling=sampling)
        index += 1
    if index:
        yield pb.PrefillRequest(last=True)  # the server keeps the extension once it sends PrefillDone


async def _each(parts: Iterable[PromptInput] | AsyncIterable[PromptInput]) -> AsyncIterator[PromptInput]:
    if isinstance(parts, AsyncIterable):
        async for part in parts:
            yield part
    else:
        for part in parts:
            yield part


async def _cancel_when_dropped(call: Any) -> AsyncIterator[Any]:
    """Yield a response stream's messages, the final `done` event only once the call has ended OK.

    Waiting for the status before handing over `done` means the server has released the
    session when the caller sees it; a consumer that stops early cancels the call instead.
    """
    try:
        async for message in call:
            if message.WhichOneof("event") == "done":
                await call.code()  # the server ends the stream right after `done`: wait for its status
            yield message
    finally:
        call.cancel()
