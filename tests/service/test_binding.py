"""The default host, `[::]`, serves IPv4 and IPv6 alike: gRPC, the HTTP API and /metrics."""

from __future__ import annotations

import http.client
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.config import Config
from service.ports import PortInUse
from tests.support.servers import RunningServer, free_port, server_config

LOOPBACKS = ("127.0.0.1", "::1")
ATTEMPTS = 5


def on_free_ports(served_model: Path) -> RunningServer:
    """A server on the default host with HTTP and /metrics on ports free a moment ago. A port another
    test's client takes as its own end in between (the hostile-client tests open thousands) is
    tried again on another port, a few times."""
    for _ in range(ATTEMPTS):
        try:
            server = RunningServer(server_config(served_model, host=Config().host, http_port=free_port()))
        except PortInUse:
            continue
        try:
            server.server.start_metrics(free_port())
        except PortInUse:
            server.close()
            continue
        return server
    raise AssertionError(f"no free ports in {ATTEMPTS} attempts")


@pytest.fixture(scope="module")
def running(served_model: Path) -> Iterator[RunningServer]:
    with on_free_ports(served_model) as server:
        yield server


def url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


@pytest.mark.parametrize("address", LOOPBACKS)
def test_grpc_on_the_default_host_answers_on_ipv4_and_ipv6(running: RunningServer, address: str) -> None:
    with grpc.insecure_channel(f"{url_host(address)}:{running.port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.parametrize("address", LOOPBACKS)
def test_the_http_api_on_the_default_host_answers_on_ipv4_and_ipv6(
    running: RunningServer, address: str
) -> None:
    connection = http.client.HTTPConnection(address, running.config.http_port, timeout=10)
    connection.request("GET", "/health")
    assert connection.getresponse().status == 200


@pytest.mark.parametrize("address", LOOPBACKS)
def test_metrics_on_the_default_host_answer_on_ipv4_and_ipv6(running: RunningServer, address: str) -> None:
    url = f"http://{url_host(address)}:{running.server._http.server_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as page:
        assert b"ladder_calls_total" in page.read()


def test_a_server_on_an_ipv4_address_serves_http_on_it_alone(served_model: Path) -> None:
    with RunningServer(server_config(served_model, http_port=free_port())) as running:
        connection = http.client.HTTPConnection("127.0.0.1", running.config.http_port, timeout=10)
        connection.request("GET", "/health")
        assert connection.getresponse().status == 200
        with pytest.raises(ConnectionRefusedError):
            http.client.HTTPConnection("::1", running.config.http_port, timeout=10).connect()
