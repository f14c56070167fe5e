"""A real Ladder server for client tests: grpc.aio on a free loopback port, in a thread of its own.

The server runs on its own event loop so sync clients, subprocesses (grpcurl,
node) and asyncio clients in the test's loop all reach it over a real channel.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from engine.convert.tokenizer_json import write_byte_level_tokenizer
from engine.modelgen.synthetic import VARIANTS, build_synthetic
from service.config import Config, config_from


def generated_model_with_tokenizer(root: Path) -> Path:
    """The generated "plain" decoder (vocab 512) with a byte-level tokenizer, so text requests work."""
    spec = VARIANTS["plain"]
    path = build_synthetic(spec, root)
    if not (path / "tokenizer.json").exists():
        write_byte_level_tokenizer(path, spec.vocab_size)
    return path


def server_config(model: Path, **overrides: Any) -> Config:
    """Flags as `ladder serve` would get them: loopback, any free port, no metrics endpoint."""
    base = config_from({"model": str(model), "host": "127.0.0.1", "port": "0", "metrics_port": "0"}, {})
    return dataclasses.replace(base, **overrides)


class LiveServer:
    """`with LiveServer(config) as server:` then connect to `server.address`."""

    def __init__(self, config: Config, start_timeout_s: float = 60.0) -> None:
        self.config = config
        self.port = 0
        self._start_timeout_s = start_timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ladder-test-server", daemon=True)
        self._server: Any = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(self._start_timeout_s)

    async def _start(self) -> None:
        from service.server import create_server

        # create_server listens, loads the model and turns health SERVING before it returns.
        self._server, self.port = await create_server(self.config)

    async def _stop(self) -> None:
        await self._server.stop()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the server's event loop: no call sends or receives anything until the block ends."""
        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            held.set()
            release.wait(self._start_timeout_s)

        self._loop.call_soon_threadsafe(hold)
        assert held.wait(self._start_timeout_s), "the server's event loop did not come round"
        try:
            yield
        finally:
            release.set()

    def __enter__(self) -> LiveServer:
        self._thread.start()
        self._run(self._start())
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self._server is not None:
                self._run(self._stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
