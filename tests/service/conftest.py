"""One real server per test module for the service tests (tests/support/servers.py), twice: gRPC
served in the server's own process, and by two frontend processes whose calls reach its core as
orders (--frontends, service/processes/frontend.py): every test that uses it holds for both."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.servers import FRONTENDS, FRONTENDS_IDS, RunningServer, server_config


@pytest.fixture(scope="module", params=FRONTENDS, ids=FRONTENDS_IDS)
def server(served_model: Path, request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    with RunningServer(server_config(served_model, frontends=request.param)) as running:
        yield running
