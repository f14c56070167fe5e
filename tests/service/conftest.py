"""Real servers on port 0 for the service tests, each on an event loop of its own thread.

Tests talk to them over real (sync) gRPC channels; the engine is the real
executor on generated models. Factories, not fixtures with hidden knobs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from engine.convert.tokenizer_json import write_byte_level_tokenizer
from engine.modelgen.synthetic import VARIANTS, build_synthetic
from proto.ladder.v1 import ladder_pb2 as pb
from proto.ladder.v1 import ladder_pb2_grpc
from service.config import Config
from service.server import LadderServer, create_server

T = TypeVar("T")


def model_with_tokenizer(root: Path, **spec_changes: Any) -> Path:
    spec = dataclasses.replace(VARIANTS["plain"], **spec_changes)
    path = build_synthetic(spec, root)
    if not (path / "tokenizer.json").exists():
        write_byte_level_tokenizer(path, spec.vocab_size)
    return path


def server_config(model_dir: Path, **changes: Any) -> Config:
    base = Config(host="127.0.0.1", port=0, metrics_port=0, model=str(model_dir), pod_name="pod-a",
                  max_sessions=12, max_new_tokens=256, drain_seconds=5.0)
    return dataclasses.replace(base, **changes)


class RunningServer:
    """A LadderServer on a private event loop thread, with helpers for sync channels."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server: LadderServer
        self.server, self.port = self.run(create_server(config))
        self.address = f"127.0.0.1:{self.port}"
        self.channel = grpc.insecure_channel(self.address)
        self.stub = ladder_pb2_grpc.LadderStub(self.channel)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stats(self) -> pb.EngineStats:
        return self.stub.GetEngineStats(pb.GetEngineStatsRequest())

    def close(self) -> None:
        self.channel.close()
        if not self.server.draining:
            self.run(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return model_with_tokenizer(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[RunningServer]:
    running = RunningServer(server_config(model_dir))
    yield running
    running.close()


def greedy_request(tokens: list[int], n: int, **stopping: Any) -> pb.GenerateRequest:
    return pb.GenerateRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=tokens)),
                              stopping=pb.StoppingOptions(max_new_tokens=n, ignore_eos=True, **stopping))


def prompt_ids(length: int, seed: int = 0) -> list[int]:
    import numpy as np

    return [int(t) for t in np.random.default_rng(seed).integers(3, 512, length)]


def wait_for(condition: Callable[[], bool], seconds: float = 20.0) -> None:
    """Poll `condition` until it holds; fail the test if it does not within `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)
