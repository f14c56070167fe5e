"""An error no table entry explains is INTERNAL, logged with its traceback, and the server drains."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from structlog.testing import capture_logs

from tests.support.prompts import greedy_request
from tests.support.servers import RunningServer, server_config


def test_an_unexpected_error_is_internal_with_a_traceback_and_flips_health(served_model: Path) -> None:
    running = RunningServer(server_config(served_model))
    try:
        serving = running.server.serving
        assert serving is not None

        def broken(*_args: object) -> list[int]:
            raise RuntimeError("a bug, not a request's fault")

        serving.model.prompt_ids = broken  # type: ignore[method-assign]
        with capture_logs() as logs, pytest.raises(grpc.RpcError) as caught:
            running.stub.Generate(greedy_request([5, 6], 2))
        assert caught.value.code() == grpc.StatusCode.INTERNAL
        logged = [e for e in logs if e["event"] == "internal_error"]
        assert len(logged) == 1 and "RuntimeError: a bug" in logged[0]["traceback"]
        health = health_pb2_grpc.HealthStub(running.channel)
        reply = health.Check(health_pb2.HealthCheckRequest(service=""))
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        running.close()
