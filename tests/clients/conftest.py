"""One real server per test session for the client tests, on a generated model with a tokenizer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from clients.python import LadderClient
from tests.clients.live_server import LiveServer, generated_model_with_tokenizer, server_config


@pytest.fixture(scope="session")
def client_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generated_model_with_tokenizer(tmp_path_factory.mktemp("client-model"))


@pytest.fixture(scope="session")
def server(client_model: Path) -> Iterator[LiveServer]:
    with LiveServer(server_config(client_model)) as live:
        with LadderClient(live.address) as client:
            assert client.wait_until_serving(60) == "SERVING"
        yield live


@pytest.fixture
def client(server: LiveServer) -> Iterator[LadderClient]:
    with LadderClient(server.address) as c:
        yield c
