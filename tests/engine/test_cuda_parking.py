"""Parked sessions on a real device (run on the H200; CI deselects `gpu`): parked KV stays in device
memory up to the device limit and the sessions idle longest spill to pinned host memory past it;
every session, wherever it was parked, continues with the greedy tokens of a fresh run."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from engine.executor import EngineOptions
from engine.executor.engine import Engine
from tests.support.engines import greedy, greedy_from_prompt
from tests.support.models import CUDA_SPEC, cuda_model

pytestmark = pytest.mark.gpu

SESSIONS = 6


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    engine = Engine.load(
        cuda_model(tmp_path_factory.mktemp("models")),
        EngineOptions(provider="cuda", capacity=1024, max_sessions=2, prefix_sharing=False),
    )
    assert engine.facts.provider == "cuda", "the gpu tests need CUDA"
    yield engine
    engine.close()


def prompts() -> list[list[int]]:
    rng = np.random.default_rng(5)
    return [rng.integers(3, CUDA_SPEC.vocab_size, 60 + 37 * i).tolist() for i in range(SESSIONS)]


@pytest.mark.parametrize("device_sessions", [0, 2, None], ids=["all-spill", "two-on-device", "no-limit"])
def test_parked_sessions_spill_past_the_device_limit_and_each_continues_as_a_fresh_run(
    engine: Engine, device_sessions: int | None
) -> None:
    ids = prompts()
    expected = [greedy_from_prompt(engine, p, 8) for p in ids]
    position = 2 * CUDA_SPEC.num_layers * CUDA_SPEC.num_kv_heads * CUDA_SPEC.head_size * 2  # fp16 K and V
    per_session = position * min(map(len, ids))  # the limit holds at most `device_sessions` sessions
    engine.limit_parked_on_device(None if device_sessions is None else device_sessions * per_session + 1)
    before = engine.stats().parking.spills
    sessions = []
    try:
        for p in ids:  # six sessions on two rows: each new one parks the least recently used idle one
            session = engine.open_session()
            engine.append(session, p)
            session.parkable = True
            sessions.append(session)
        stats = engine.stats().parking
        assert stats.sessions_parked == SESSIONS - 2
        if device_sessions is None:
            assert stats.spills == before and stats.device_bytes == stats.parked_bytes
        else:
            assert stats.spills > before and stats.device_bytes <= device_sessions * per_session + 1
            assert stats.device_bytes < stats.parked_bytes
        for i in np.random.default_rng(1).permutation(SESSIONS):
            assert greedy(engine, sessions[i], 8) == expected[i], f"session {i}"
            engine.check_invariants()
    finally:
        for session in sessions:
            engine.close_session(session, keep=False)
        engine.limit_parked_on_device(None)
    after = engine.stats().parking
    assert after.sessions_parked == 0 and after.parked_bytes == 0 and after.device_bytes == 0
