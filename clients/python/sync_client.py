"""The blocking Ladder client: one typed method per RPC over the generated stubs.

Every call carries the connection's bearer token and a deadline (the call's own
`timeout_s`, else the connection default). Failures surface as `grpc.RpcError`
with the server's status code. A stream abandoned before its end is cancelled,
so the server frees what the call held.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from clients.python.channel import HEALTH_CHECK, Connection, sync_channel
from clients.python.messages import (
    Constraint,
    Logprobs,
    PromptInput,
    Sampling,
    Stopping,
    Turn,
    decode_request,
    generate_request,
    prefill_requests,
    tokenize_request,
)
from proto.ladder.v1 import ladder_pb2 as pb
from proto.ladder.v1 import ladder_pb2_grpc

# Handed a streaming call as it starts (e.g. to cancel it from a signal handler's thread).
OnCall = Callable[[grpc.Call], None]


class LadderClient:
    """A channel to one server; use as a context manager or call `close()`."""

    def __init__(self, connection: Connection | str) -> None:
        self.connection = Connection(connection) if isinstance(connection, str) else connection
        self._channel = sync_channel(self.connection)
        self._stub = ladder_pb2_grpc.LadderStub(self._channel)
        # grpc.health.v1 Check, typed (the types-grpcio-health-checking HealthStub declares no methods).
        self._health_check = self._channel.unary_unary(
            HEALTH_CHECK,
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )

    def __enter__(self) -> LadderClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _call(self, timeout_s: float | None, request_id: str | None = None) -> dict[str, Any]:
        metadata = self.connection.metadata()
        if request_id:
            metadata += (("x-request-id", request_id),)
        return {"timeout": self.connection.deadline(timeout_s), "metadata": metadata}

    def generate(
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
        result: pb.Completion = self._stub.Generate(request, **self._call(timeout_s, request_id))
        return result

    def generate_stream(
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
    ) -> Iterator[pb.TokenEvent]:
        """One TokenEvent per token (`event.token.sample`: of which sample), then the final Completion.

        With `coalesce`, tokens that were ready together share one event (`event.tokens`; read
        either shape with `messages.tokens_of`)."""
        request = generate_request(prompt, sampling, stopping, n, logprobs, constraint, coalesce)
        call = self._stub.GenerateStream(request, **self._call(timeout_s, request_id))
        yield from _cancel_when_dropped(call)

    def prefill_stream(
        self,
        parts: Iterable[PromptInput],
        *,
        session_id: str = "",
        sampling: Sampling | None = None,
        timeout_s: float | None = None,
        on_call: OnCall | None = None,
    ) -> Iterator[pb.PrefillEvent]:
        """Stream prompt parts into a new (or the named) session: ForwardEvents, then PrefillDone.

        `on_call` gets the gRPC call as it starts: another thread may `cancel()` it."""
        requests = prefill_requests(parts, session_id, sampling)
        call = _started(self._stub.Prefill(requests, **self._call(timeout_s)), on_call)
        yield from _cancel_when_dropped(call)

    def prefill(
        self,
        parts: Iterable[PromptInput],
        *,
        session_id: str = "",
        sampling: Sampling | None = None,
        timeout_s: float | None = None,
        on_call: OnCall | None = None,
    ) -> tuple[list[pb.ForwardEvent], pb.PrefillDone]:
        """Run a whole Prefill; return its forwards and the final PrefillDone."""
        forwards: list[pb.ForwardEvent] = []
        for event in self.prefill_stream(
            parts, session_id=session_id, sampling=sampling, timeout_s=timeout_s, on_call=on_call
        ):
            if event.WhichOneof("event") == "done":
                return forwards, event.done
            forwards.append(event.forward)
        raise RuntimeError("Prefill ended without PrefillDone")

    def decode(
        self,
        session_id: str,
        max_new_tokens: int,
        *,
        sampling: Sampling | None = None,
        stopping: Stopping | None = None,
        timeout_s: float | None = None,
        logprobs: Logprobs | None = None,
        on_call: OnCall | None = None,
        constraint: Constraint | None = None,
        coalesce: bool = False,
    ) -> Iterator[pb.TokenEvent]:
        """Continue the session by up to `max_new_tokens` tokens, streamed; ends with a Completion
        (`coalesce`: as generate_stream's).

        `on_call` gets the gRPC call as it starts: another thread may `cancel()` it."""
        request = decode_request(
            session_id, max_new_tokens, sampling, stopping, logprobs, constraint, coalesce
        )
        call = _started(self._stub.Decode(request, **self._call(timeout_s)), on_call)
        yield from _cancel_when_dropped(call)

    def rewind(self, session_id: str, length: int, *, timeout_s: float | None = None) -> pb.RewindResponse:
        request = pb.RewindRequest(session_id=session_id, length=length)
        result: pb.RewindResponse = self._stub.Rewind(request, **self._call(timeout_s))
        return result

    def close_session(self, session_id: str, *, timeout_s: float | None = None) -> pb.CloseSessionResponse:
        request = pb.CloseSessionRequest(session_id=session_id)
        result: pb.CloseSessionResponse = self._stub.CloseSession(request, **self._call(timeout_s))
        return result

    def fork_session(
        self, session_id: str, length: int | None = None, *, fork_id: str = "", timeout_s: float | None = None
    ) -> pb.ForkSessionResponse:
        """A new session holding a copy of the first `length` tokens (None: all) of `session_id`.

        With a `fork_id` (chosen, and kept, before the call: a UUID) the fork's id is
        `fork_session_id(session_id, fork_id)` whether or not the answer arrives: retry with the
        same arguments (the fork already made answers) or close that id."""
        request = pb.ForkSessionRequest(session_id=session_id, length=length, fork_id=fork_id)
        result: pb.ForkSessionResponse = self._stub.ForkSession(request, **self._call(timeout_s))
        return result

    def tokenize(self, source: str | Sequence[Turn], *, timeout_s: float | None = None) -> list[int]:
        response = self._stub.Tokenize(tokenize_request(source), **self._call(timeout_s))
        return list(response.ids)

    def detokenize(self, ids: Sequence[int], *, timeout_s: float | None = None) -> str:
        response = self._stub.Detokenize(pb.DetokenizeRequest(ids=list(ids)), **self._call(timeout_s))
        return str(response.text)

    def model_info(self, *, timeout_s: float | None = None) -> pb.ModelInfo:
        result: pb.ModelInfo = self._stub.GetModelInfo(pb.GetModelInfoRequest(), **self._call(timeout_s))
        return result

    def engine_stats(self, *, timeout_s: float | None = None) -> pb.EngineStats:
        request = pb.GetEngineStatsRequest()
        result: pb.EngineStats = self._stub.GetEngineStats(request, **self._call(timeout_s))
        return result

    def health(self, service: str = "", *, timeout_s: float | None = None) -> str:
        """The grpc.health.v1 status name: "SERVING", "NOT_SERVING", ..."""
        request = health_pb2.HealthCheckRequest(service=service)
        response = self._health_check(request, **self._call(timeout_s))
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))

    def wait_until_serving(self, timeout_s: float, *, service: str = "", poll_s: float = 0.25) -> str:
        """Poll health until SERVING or `timeout_s` passes; return the last status seen."""
        deadline = time.monotonic() + timeout_s
        status = "UNREACHABLE"
        while True:
            status = _health_or_unreachable(self, service, min(5.0, max(0.1, deadline - time.monotonic())))
            if status == "SERVING" or time.monotonic() + poll_s > deadline:
                return status
            time.sleep(poll_s)


def _health_or_unreachable(client: LadderClient, service: str, timeout_s: float) -> str:
    try:
        return client.health(service, timeout_s=timeout_s)
    except grpc.RpcError as error:
        # Not up yet (connection refused) or still loading: both mean "keep waiting".
        if error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return "UNREACHABLE"
        raise


def _started(call: Any, on_call: OnCall | None) -> Any:
    if on_call is not None:
        on_call(call)
    return call


def _cancel_when_dropped(call: Any) -> Iterator[Any]:
    """Yield a response stream's messages, the final `done` event only once the call has ended OK.

    Waiting for the status before handing over `done` means the server has released the
    session when the caller sees it; a consumer that stops early cancels the call instead.
    """
    try:
        for message in call:
            if message.WhichOneof("event") == "done":
                for _ in call:
                    pass  # the server ends the stream right after `done`: read up to its status
            yield message
    finally:
        call.cancel()
