"""Sessions beyond slots, on the numerics users serve (the default model in int4 and fp16): a
session parked off its KV row and brought back into another row continues exactly as if it had
never left, more sessions stay open than the pool has rows, and a row nobody holds costs no memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from engine.errors import Exhausted, NoFreeRow, ParkingFull
from engine.executor import DecodeRow, Step
from engine.executor.engine import Engine
from engine.sampling import Sampler, SamplingParams
from engine.tokenizer import Tokenizer
from tests.support.engines import greedy, load_default

PROMPTS = (
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at a temperature of",
    "My favourite book is",
)


@pytest.fixture(scope="module", params=["int4", "fp16"])
def model_dir(request: pytest.FixtureRequest, default_model: Callable[..., Path]) -> Path:
    return default_model(request.param)


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Tokenizer:
    return Tokenizer(model_dir)


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Iterator[Engine]:
    engine = load_default(model_dir, max_sessions=2, capacity=512, prefix_sharing=False)
    yield engine
    engine.close()


def fresh(engine: Engine, ids: list[int], steps: int) -> list[int]:
    session = engine.open_session()
    try:
        return greedy(engine, session, steps, ids)
    finally:
        engine.close_session(session, keep=False)


def test_a_parked_session_continues_with_the_tokens_it_would_have_chosen(
    engine: Engine, tokenizer: Tokenizer
) -> None:
    ids = tokenizer.encode(PROMPTS[0])
    expected = fresh(engine, ids, 12)
    session = engine.open_session()
    try:
        first = greedy(engine, session, 6, ids)
        assert engine.park(session) > 0 and session.row == -1
        rest = greedy(engine, session, 6)  # brought back on its first touch
        assert first + rest == expected and session.row >= 0
    finally:
        engine.close_session(session, keep=False)
    engine.check_invariants()


def test_more_sessions_than_rows_stay_open_and_each_continues_as_a_fresh_run(
    engine: Engine, tokenizer: Tokenizer
) -> None:
    prompts = [tokenizer.encode(text) for text in PROMPTS]
    expected = [fresh(engine, ids, 8) for ids in prompts]
    sessions = []
    try:
        for ids in prompts:  # six sessions on two rows: each new one parks the least recent idle one
            session = engine.open_session()
            engine.append(session, ids)
            session.parkable = True
            sessions.append(session)
        stats = engine.stats().parking
        assert engine.sessions_open == 6 and stats.sessions_parked == 4
        assert stats.parked_bytes == sum(int(s.parked.nbytes) for s in sessions if s.parked is not None)
        order = np.random.default_rng(0).permutation(len(sessions))
        for i in order:
            assert greedy(engine, sessions[i], 8) == expected[i]
            engine.check_invariants()
    finally:
        for session in sessions:
            engine.close_session(session, keep=False)
    assert engine.sessions_open == 0 and engine.stats().parking.sessions_parked == 0


def test_a_session_in_use_is_never_parked_to_make_room(engine: Engine, tokenizer: Tokenizer) -> None:
    busy = [engine.open_session() for _ in range(2)]  # parkable stays False: in use
    try:
        for session in busy:
            engine.append(session, tokenizer.encode(PROMPTS[1]))
        assert engine.free_slots == 0
        with pytest.raises(Exhausted) as refused:
            engine.open_session()
        assert not isinstance(refused.value, NoFreeRow)  # a new session fails at once: it does not wait
        assert all(s.row >= 0 for s in busy)
    finally:
        for session in busy:
            engine.close_session(session, keep=False)


def test_a_step_never_parks_one_of_its_own_sessions_to_bring_back_another(
    engine: Engine, tokenizer: Tokenizer
) -> None:
    sessions = []
    try:
        for text in PROMPTS[:3]:
            session = engine.open_session()
            engine.append(session, tokenizer.encode(text))
            session.parkable = True
            sessions.append(session)
        parked = [s for s in sessions if s.parked is not None]
        resident = [s for s in sessions if s.parked is None]
        assert len(parked) == 1 and len(resident) == 2
        sampler = Sampler(SamplingParams())
        rows = tuple(DecodeRow(s, 0, sampler) for s in (*resident, *parked))  # three rows, two slots
        result = engine.step(Step(decode=rows))
        failed = [o for o in result.decode if o.error is not None]
        assert len(failed) == 1 and isinstance(failed[0].error, NoFreeRow)
        assert result.decode[-1].error is not None  # the parked one waits; the two resident ran
        engine.check_invariants()
    finally:
        for session in sessions:
            engine.close_session(session, keep=False)


def test_a_closed_parked_session_frees_its_parked_bytes(engine: Engine, tokenizer: Tokenizer) -> None:
    session = engine.open_session()
    engine.append(session, tokenizer.encode(PROMPTS[2]))
    engine.park(session)
    assert engine.stats().parking.parked_bytes > 0
    engine.close_session(session)
    assert engine.stats().parking.parked_bytes == 0 and engine.sessions_open == 0
    engine.check_invariants()


def test_a_session_parks_only_within_the_limit_at_the_size_known_before_it_parks(
    engine: Engine, tokenizer: Tokenizer
) -> None:
    session = engine.open_session()
    try:
        greedy(engine, session, 2, tokenizer.encode(PROMPTS[1]))
        size = engine.parked_size(session.length)
        engine.limit_parked(size - 1)
        with pytest.raises(ParkingFull):
            engine.park(session)
        assert session.row >= 0 and engine.parking().parked_bytes == 0  # untouched, still in its row
        engine.limit_parked(size)
        assert engine.park(session) == size and engine.parking().parked_bytes == size
    finally:
        engine.limit_parked(None)
        engine.close_session(session, keep=False)
