"""One real server per test module for the service tests (tests/support/servers.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.servers import RunningServer, server_config


@pytest.fixture(scope="module")
def server(served_model: Path) -> Iterator[RunningServer]:
    with RunningServer(server_config(served_model)) as running:
        yield running
