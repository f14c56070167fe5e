"""An error no table entry explains fails its call alone (INTERNAL, logged with its traceback, or 500
on HTTP) and the server keeps serving; only a fault the engine reports drains it."""

from __future__ import annotations

import asyncio
import http.client
import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from structlog.testing import capture_logs

from engine.errors import EngineFault
from service.core.serving import Serving
from tests.support.prompts import greedy_request
from tests.support.servers import RunningServer, free_port, server_config

SERVING = health_pb2.HealthCheckResponse.SERVING


@pytest.fixture(scope="module")
def running(served_model: Path) -> Iterator[RunningServer]:
    # One process: the test breaks its model view and reads its log (a frontend has its own).
    with RunningServer(server_config(served_model, http_port=free_port(), frontends=0)) as server:
        yield server


def health(running: RunningServer) -> int:
    reply = health_pb2_grpc.HealthStub(running.channel).Check(health_pb2.HealthCheckRequest(service=""))
    return int(reply.status)


def broken_prompts(running: RunningServer) -> Serving:
    """Make every prompt raise a bug (not a request's fault); undone with `del serving.model.prompt_ids`."""
    serving = running.server.serving
    assert serving is not None

    def broken(*_args: object) -> list[int]:
        raise RuntimeError("a bug, not a request's fault")

    serving.model.prompt_ids = broken  # type: ignore[method-assign]
    return serving


def test_an_unexpected_error_is_internal_with_a_traceback_and_the_server_keeps_serving(
    running: RunningServer,
) -> None:
    serving = broken_prompts(running)
    try:
        with capture_logs() as logs, pytest.raises(grpc.RpcError) as caught:
            running.stub.Generate(greedy_request([5, 6], 2), metadata=(("x-request-id", "bug-1"),))
    finally:
        del serving.model.prompt_ids
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    logged = [e for e in logs if e["event"] == "internal_error"]
    assert len(logged) == 1 and "RuntimeError: a bug" in logged[0]["traceback"]
    assert logged[0]["request_id"] == "bug-1"
    assert running.calls("Generate", "INTERNAL") >= 1
    assert health(running) == SERVING and not running.server.draining
    assert len(running.stub.Generate(greedy_request([5, 6], 2)).token_ids) == 2


def test_an_http_handlers_unexpected_error_is_a_500_and_the_server_keeps_serving(
    running: RunningServer,
) -> None:
    serving = broken_prompts(running)
    connection = http.client.HTTPConnection("127.0.0.1", running.config.http_port, timeout=30)
    body = {"prompt": [5, 6], "max_tokens": 2, "temperature": 0}
    try:
        with capture_logs() as logs:
            connection.request("POST", "/v1/completions", json.dumps(body), {"x-request-id": "bug-2"})
            response = connection.getresponse()
            error = json.loads(response.read())["error"]
    finally:
        del serving.model.prompt_ids
    assert response.status == 500 and error["type"] == "server_error" and error["code"] == "internal"
    assert [e["request_id"] for e in logs if e["event"] == "internal_error"] == ["bug-2"]
    assert health(running) == SERVING and not running.server.draining
    connection.request("POST", "/v1/completions", json.dumps(body))
    answered = connection.getresponse()
    assert answered.status == 200 and json.loads(answered.read())["usage"]["completion_tokens"] == 2


def test_a_fault_the_engine_raises_drains_the_server(served_model: Path) -> None:
    running = RunningServer(server_config(served_model))
    try:
        engine = running.scheduler.engine

        def faulty(*_args: object) -> object:
            raise EngineFault("a forward failed on the device")

        engine.step = faulty  # type: ignore[method-assign]
        with pytest.raises(grpc.RpcError) as caught:
            running.stub.Generate(greedy_request([5, 6], 2))
        assert caught.value.code() == grpc.StatusCode.INTERNAL
        running.run(asyncio.wait_for(running.server.stopped.wait(), 15))
        assert running.server.draining and isinstance(running.server.fault, EngineFault)
    finally:
        running.close()
