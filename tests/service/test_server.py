"""The server around the servicer: health while loading, reflection, request ids."""

from __future__ import annotations

import asyncio
import gc
import threading
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from proto.ladder.v1 import ladder_pb2 as pb
from proto.ladder.v1 import ladder_pb2_grpc
from service.server import LadderServer
from tests.support.prompts import greedy_request
from tests.support.servers import RunningServer, server_config


def test_health_is_not_serving_and_calls_unavailable_until_the_model_is_loaded(served_model: Path) -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(coro):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, loop).result(30)

    async def make() -> LadderServer:  # grpc.aio servers belong to the loop that makes them
        return LadderServer(server_config(served_model))

    server = run(make())
    port = run(server.start())
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for name in ("", "ladder.v1.Ladder"):
                status = health.Check(health_pb2.HealthCheckRequest(service=name)).status
                assert status == health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(grpc.RpcError) as caught:
                ladder_pb2_grpc.LadderStub(channel).GetModelInfo(pb.GetModelInfoRequest())
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            run(server.load())
            serving = health_pb2.HealthCheckResponse.SERVING
            assert health.Check(health_pb2.HealthCheckRequest()).status == serving
    finally:
        run(server.stop())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


@pytest.mark.parametrize("freeze", [False, True])
def test_only_a_serving_process_freezes_what_start_up_built(served_model: Path, freeze: bool) -> None:
    """`serve` (python -m service) loads with freeze: start-up's objects leave the collector's sight.
    A server started inside another program (these tests) leaves its collector alone."""

    async def start_and_stop() -> int:
        server = LadderServer(server_config(served_model))
        await server.start()
        try:
            before = gc.get_freeze_count()
            await server.load(freeze=freeze)
            return gc.get_freeze_count() - before
        finally:
            await server.stop()

    try:
        frozen = asyncio.run(start_and_stop())
    finally:
        gc.unfreeze()  # this test process goes on running other tests
    assert (frozen > 0) if freeze else (frozen == 0)


def test_reflection_lists_the_ladder_health_and_reflection_services(server: RunningServer) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(server.channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    reply = next(stub.ServerReflectionInfo(iter([request])))
    names = {s.name for s in reply.list_services_response.service}
    assert {"ladder.v1.Ladder", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= names


def test_the_request_id_from_metadata_is_echoed_in_the_completion_and_trailers(server: RunningServer) -> None:
    metadata = (("x-request-id", "r-42"),)
    reply, call = server.stub.Generate.with_call(greedy_request([5, 6], 2), metadata=metadata)
    assert reply.request_id == "r-42"
    assert ("x-request-id", "r-42") in tuple(call.trailing_metadata())
