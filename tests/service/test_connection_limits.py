"""What gRPC connections may hold: the file limit raised, the connection cap, the handshake timeout,
and the calls one client address may have open (service/ports.py, service/interceptors/peer_calls.py)."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from service.config import Config
from service.interceptors.peer_calls import peer_address
from service.ports import ConnectionLimits, server_options
from tests.support.hostile import H2_PREFACE, count_closed, health_seconds, server_answers, stalled
from tests.support.prompts import greedy_request, prompt_ids
from tests.support.rich_errors import details_of
from tests.support.servers import RunningServer, both_ways, server_config
from tests.support.waiting import wait_for


def test_every_connection_limit_of_the_config_reaches_the_grpc_options() -> None:
    config = Config(
        grpc_max_connections=77,
        grpc_max_concurrent_streams=9,
        grpc_handshake_timeout_seconds=2.5,
        grpc_idle_timeout_seconds=30,
    )
    options = dict(server_options(1000, ConnectionLimits.of(config)))
    assert options["grpc.max_allowed_incoming_connections"] == 77
    assert options["grpc.max_concurrent_streams"] == 9
    assert options["grpc.server_handshake_timeout_ms"] == 2500
    assert options["grpc.max_connection_idle_ms"] == 30_000
    assert options["grpc.http2.max_ping_strikes"] > 0 and options["grpc.keepalive_time_ms"] > 0


def test_the_automatic_connection_cap_is_half_the_open_file_limit() -> None:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert ConnectionLimits().connections() == max(64, soft // 2)


def test_a_process_that_serves_raises_its_open_file_limit_to_the_hard_one() -> None:
    script = (
        "import resource; from service.limits import raise_file_limit; "
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE); "
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard)); "
        "print(raise_file_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parents[2],
    )
    returned, soft, hard = (int(word) for word in done.stdout.split()[-3:])
    assert returned == soft == min(hard, 1 << 20) and "file_limit" in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("peer", "address"),
    [
        ("ipv4:10.0.0.7:51234", "ipv4:10.0.0.7"),
        ("ipv6:[::1]:5", "ipv6:[::1]"),
        ("unix:/tmp/s", "unix:/tmp/s"),
        ("", ""),
    ],
)
def test_a_peer_is_counted_by_its_address_without_the_port(peer: str, address: str) -> None:
    assert peer_address(peer) == address


def test_connections_past_the_cap_are_closed_and_the_server_answers_once_they_leave(
    served_model: Path,
) -> None:
    cap = 8
    with RunningServer(server_config(served_model, grpc_max_connections=cap)) as running:
        with stalled(running.port, cap + 5, H2_PREFACE) as sockets:
            assert count_closed(sockets, at_least=5, within_s=10) == 5
        wait_for(lambda: _answers(running.address), what="the server to answer after the connections left")


def test_a_connection_that_never_finishes_its_handshake_is_closed_after_the_timeout(
    served_model: Path,
) -> None:
    with RunningServer(server_config(served_model, grpc_handshake_timeout_seconds=0.5)) as running:
        with stalled(running.port, 20, H2_PREFACE[:10]) as sockets:
            assert count_closed(sockets, at_least=20, within_s=10) == 20
        server_answers(running.address)


@both_ways
def test_one_address_past_max_calls_per_peer_is_refused_while_health_and_other_calls_go_on(
    served_model: Path, frontends: int
) -> None:
    with RunningServer(server_config(served_model, max_calls_per_peer=1, frontends=frontends)) as running:
        with running.frozen() as scheduler:
            depth = scheduler.depth
            held = running.stub.Generate.future(greedy_request(prompt_ids(5), 2))
            wait_for(lambda: scheduler.depth > depth, what="the first call to reach the worker")
            refused = details_of(lambda: running.stub.Generate(greedy_request(prompt_ids(5), 2)))
            assert health_seconds(running.address) < 1.0
        assert len(held.result(timeout=30).token_ids) == 2
        server_answers(running.address)  # the held call has ended: the address may call again
    assert refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED and refused.reason == "PEER_CALLS"
    assert refused.metadata == {"max_calls_per_peer": "1"} and refused.retry_seconds == 1.0
    labels = {"listener": "grpc", "reason": "calls_per_peer"}
    assert running.server.metrics.registry.get_sample_value("ladder_connections_refused_total", labels) == 1


def _answers(address: str) -> bool:
    """Whether the server answers (a cap still full refuses the new channel: UNAVAILABLE)."""
    try:
        server_answers(address)
    except grpc.RpcError:
        return False
    return True
