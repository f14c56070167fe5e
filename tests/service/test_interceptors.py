"""The interceptor chain on a bare grpc.aio server (no model): which refusal wins, and that every
Ladder call is counted and logged before its client sees how it ended."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from structlog.testing import capture_logs

from proto.ladder.v1 import ladder_pb2 as pb
from proto.ladder.v1 import ladder_pb2_grpc
from service.errors import Draining, SessionNotFound
from service.grpc.parsing import add_ladder_service
from service.interceptors import chain
from service.interceptors.access_log import AccessLog
from tests.support.waiting import wait_for

TOKEN = (("authorization", "Bearer secret"),)
LIMIT = 64


class Fake(ladder_pb2_grpc.LadderServicer):
    """GetModelInfo answers or raises `error`; GenerateStream yields one event, then raises or waits."""

    def __init__(self) -> None:
        self.error: Exception | None = None
        self.stream_waits = False

    async def GetModelInfo(self, request: Any, context: Any) -> pb.ModelInfo:
        if self.error is not None:
            raise self.error
        return pb.ModelInfo(vocab_size=7)

    async def GenerateStream(self, request: Any, context: Any) -> AsyncIterator[pb.TokenEvent]:
        yield pb.TokenEvent(token=pb.Token(id=5))
        if self.stream_waits:
            await asyncio.Event().wait()
        raise SessionNotFound("no such session")


class Chained:
    """A grpc.aio server with Ladder's interceptor chain, health and the Fake, on a loop of its own."""

    def __init__(self) -> None:
        self.done: list[tuple[str, str]] = []
        self.draining = False
        self.fake = Fake()
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = ladder_pb2_grpc.LadderStub(self.channel)

    def _gate(self) -> None:
        if self.draining:
            raise Draining("the server is draining")

    async def _start(self) -> int:
        self.access_log = AccessLog(lambda name, code, _, __: self.done.append((name, code.name)))
        interceptors = chain(self.access_log, self._gate, ("alice=secret",))
        self.grpc = grpc.aio.server(interceptors=interceptors)
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), self.grpc)
        add_ladder_service(self.fake, self.grpc, LIMIT)
        port = self.grpc.add_insecure_port("127.0.0.1:0")
        await self.grpc.start()
        return int(port)

    def close(self) -> None:
        self.channel.close()
        asyncio.run_coroutine_threadsafe(self.grpc.stop(0), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture
def chained() -> Iterator[Chained]:
    server = Chained()
    yield server
    server.close()


def refused(call: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def test_a_call_without_a_token_is_refused_counted_and_logged_with_its_request_id(chained: Chained) -> None:
    with capture_logs() as logs:
        error = refused(
            lambda: chained.stub.GetModelInfo(
                pb.GetModelInfoRequest(), metadata=(("x-request-id", "no-token-1"),)
            )
        )
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert ("x-request-id", "no-token-1") in tuple(error.trailing_metadata())
    assert chained.done == [("GetModelInfo", "UNAUTHENTICATED")]
    failed = [(e["request_id"], e["code"], e["caller"]) for e in logs if e["event"] == "rpc_failed"]
    assert failed == [("no-token-1", "UNAUTHENTICATED", "")]


def test_a_draining_server_refuses_a_call_without_a_token_as_draining(chained: Chained) -> None:
    chained.draining = True
    assert (
        refused(lambda: chained.stub.GetModelInfo(pb.GetModelInfoRequest())).code()
        == grpc.StatusCode.UNAVAILABLE
    )
    assert chained.done == [("GetModelInfo", "UNAVAILABLE")]


def test_a_message_over_the_limit_is_refused_only_after_the_token_check(chained: Chained) -> None:
    big = pb.GenerateRequest(prompt=pb.Prompt(text="x" * (2 * LIMIT)))
    assert refused(lambda: list(chained.stub.GenerateStream(big))).code() == grpc.StatusCode.UNAUTHENTICATED
    too_large = refused(lambda: list(chained.stub.GenerateStream(big, metadata=TOKEN)))
    assert too_large.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert chained.done == [("GenerateStream", "UNAUTHENTICATED"), ("GenerateStream", "INVALID_ARGUMENT")]


def test_a_stream_that_fails_midway_is_counted_and_logged_before_its_client_sees_the_status(
    chained: Chained,
) -> None:
    with capture_logs() as logs:
        stream = chained.stub.GenerateStream(pb.GenerateRequest(), metadata=TOKEN)
        assert next(stream).token.id == 5
        error = refused(lambda: next(stream))
        # Read at once, with no wait: both were written before the status went out.
        counted, lines = list(chained.done), [e for e in logs if e["event"] == "rpc_failed"]
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert counted == [("GenerateStream", "NOT_FOUND")]
    assert [(e["method"], e["caller"]) for e in lines] == [("GenerateStream", "alice")]


def test_an_error_no_table_entry_explains_is_internal_logged_once_and_fails_that_call_alone(
    chained: Chained,
) -> None:
    chained.fake.error = RuntimeError("a bug")
    with capture_logs() as logs:
        assert (
            refused(lambda: chained.stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=TOKEN)).code()
            == grpc.StatusCode.INTERNAL
        )
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["internal_error", "rpc_failed"]
    chained.fake.error = None
    chained.stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=TOKEN)  # the next call is served


def test_a_cancelled_stream_is_logged_as_cancelled_and_leaves_nothing_in_flight(chained: Chained) -> None:
    chained.fake.stream_waits = True
    with capture_logs() as logs:
        stream = chained.stub.GenerateStream(pb.GenerateRequest(), metadata=TOKEN)
        next(stream)
        stream.cancel()
        wait_for(lambda: chained.done == [("GenerateStream", "CANCELLED")])
    wait_for(lambda: chained.access_log.in_flight == 0)
    assert [e["code"] for e in logs if e["event"] == "rpc_cancelled"] == ["CANCELLED"]


def test_health_passes_the_chain_untouched(chained: Chained) -> None:
    chained.draining = True
    reply = health_pb2_grpc.HealthStub(chained.channel).Check(health_pb2.HealthCheckRequest(service=""))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    assert chained.done == [] and chained.access_log.in_flight == 0


def test_a_call_with_its_token_succeeds_and_is_logged_once(chained: Chained) -> None:
    with capture_logs() as logs:
        assert chained.stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=TOKEN).vocab_size == 7
    assert chained.done == [("GetModelInfo", "OK")]
    assert [(e["event"], e["caller"]) for e in logs] == [("rpc", "alice")]
