"""One real server per test session for the client tests, on the served generated model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from clients.python import LadderClient
from tests.support.pki import make_pki
from tests.support.servers import RunningServer, server_config
from tests.support.waiting import wait_for


@pytest.fixture(scope="session")
def server(served_model: Path) -> Iterator[RunningServer]:
    with RunningServer(server_config(served_model, max_sessions=8, max_new_tokens=1024)) as running:
        with LadderClient(running.address) as client:
            assert client.wait_until_serving(60) == "SERVING"
        yield running


@pytest.fixture
def client(server: RunningServer) -> Iterator[LadderClient]:
    # The server is shared by every client test: each starts once the sessions an earlier one
    # closed are gone (a session leaked for good fails the next test here).
    wait_for(lambda: server.stats().sessions_open == 0, what="the earlier tests' sessions to close")
    with LadderClient(server.address) as c:
        yield c


@pytest.fixture(scope="session")
def tls_token_server(
    served_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningServer, Path]]:
    """A server on TLS that wants the bearer token "tok-alice", and the CA that signed its certificate:
    what the Go and Java clients' --tls-ca and --token are checked against."""
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    config = server_config(
        served_model,
        tls_cert=str(pki / "server.pem"),
        tls_key=str(pki / "server.key"),
        auth_tokens=("alice=tok-alice",),
    )
    with RunningServer(config) as running:
        yield running, pki / "ca.pem"
