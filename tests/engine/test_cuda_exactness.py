"""Exactness on a real device in fp16 (run on the H200; CI deselects `gpu`): rewind, a shorter fork,
a one-token part, a prompt one row past a chunk and a repeated prompt over its held prefix continue
as a fresh run; in the deterministic mode bit for bit, and decode rows whatever rows decode beside them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from engine.executor import DecodeRow, EngineOptions, Session
from engine.executor.engine import Engine
from engine.sampling import Sampler, SamplingParams
from tests.support.exactness import Fresh, check_fork_and_one_token_part, decode, same
from tests.support.models import CUDA_SPEC, cuda_model

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cuda_model(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module", params=[False, True], ids=["default", "deterministic"])
def engine(request: pytest.FixtureRequest, model_dir: Path) -> Iterator[Engine]:
    engine = Engine.load(
        model_dir,
        EngineOptions(
            provider="cuda", capacity=2048, max_sessions=4, chunk_size=512, deterministic=request.param
        ),
    )
    assert engine.backend.name == "cuda"
    yield engine
    engine.close()


def tokens(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, CUDA_SPEC.vocab_size, n).tolist()  # type: ignore[no-any-return]


@pytest.mark.parametrize("length", [40, 513, 700])
def test_rewind_fork_and_one_token_parts_continue_as_a_fresh_run(engine: Engine, length: int) -> None:
    ids = tokens(length, length)
    fresh = Fresh(engine, ids)
    source = engine.open_session()
    try:
        engine.append(source, ids)
        assert decode(engine, source) == fresh.tokens
        engine.decode([DecodeRow(source, fresh.tokens[-1])])
        engine.rewind(source, length)
        same(engine, source, fresh)
        engine.append(source, tokens(30, 1))
        check_fork_and_one_token_part(engine, source, ids, fresh)
    finally:
        engine.close_session(source, keep=False)


def test_a_repeated_prompt_over_its_held_prefix_continues_as_a_fresh_run(engine: Engine) -> None:
    ids = tokens(1025, 7)
    fresh = Fresh(engine, ids)
    for _ in range(2):
        session = engine.open_session(prompt=ids)
        try:
            engine.append(session, ids[session.length :])
            same(engine, session, fresh)
        finally:
            engine.close_session(session)


def test_deterministic_decode_rows_do_not_depend_on_the_rows_beside_them(engine: Engine) -> None:
    if not engine.options.deterministic:
        pytest.skip("the default mode's decode width follows the load")
    prompts = [tokens(100 + 10 * i, 50 + i) for i in range(4)]
    alone = []
    for ids in prompts:
        session = engine.open_session()
        engine.append(session, ids)
        alone.append(decode(engine, session, 24))
        engine.close_session(session, keep=False)
    sessions = [engine.open_session() for _ in prompts]
    try:
        for session, ids in zip(sessions, prompts, strict=True):
            engine.append(session, ids)
        together: list[list[int]] = [[] for _ in prompts]
        samplers = [Sampler(SamplingParams()) for _ in prompts]
        for i, session in enumerate(sessions):
            together[i].append(engine.choose(session, samplers[i]))
        while len(together[0]) < 24:
            chosen = engine.decode(
                [DecodeRow(s, t[-1], m) for s, t, m in zip(sessions, together, samplers, strict=True)]
            )
            for t, c in zip(together, chosen, strict=True):
                assert c is not None
                t.append(c)
        assert together == alone
    finally:
        for session in sessions:
            engine.close_session(session, keep=False)


def greedy_with_logits(
    engine: Engine, session: Session, steps: int = 10
) -> tuple[list[int], list[np.ndarray]]:
    """Greedy tokens, each fed back in one decode step, and the next-token logits before each."""
    sampler = Sampler(SamplingParams())
    logits, out = [engine.logits(session)], [engine.choose(session, sampler)]
    while len(out) < steps:
        chosen = engine.decode([DecodeRow(session, out[-1], sampler)])[0]
        assert chosen is not None
        out.append(chosen)
        logits.append(engine.logits(session))
    return out, logits


@pytest.mark.parametrize("held", [1, 3])
def test_a_greedy_answer_is_bit_equal_while_other_sessions_idle(engine: Engine, held: int) -> None:
    """A decode forward's width follows the rows that decode: a session above it moves down
    (Engine.compact), so idle sessions below it never change its answer (issue #46)."""
    ids = tokens(60, 60)
    alone = engine.open_session()
    try:
        engine.append(alone, ids)
        expected = greedy_with_logits(engine, alone)
    finally:
        engine.close_session(alone, keep=False)
    idle = [engine.open_session() for _ in range(held)]
    session = engine.open_session()
    try:
        for i, s in enumerate(idle):
            engine.append(s, tokens(20 + i, i))
        engine.append(session, ids)
        assert session.row == held
        out, logits = greedy_with_logits(engine, session)
        assert out == expected[0]
        for mine, theirs in zip(logits, expected[1], strict=True):
            np.testing.assert_array_equal(mine, theirs)
        if not engine.options.deterministic:  # (the deterministic mode's forwards bind every row)
            assert engine.stats().decode.rows_moved > 0 and session.row < engine.decoder.width(1)
    finally:
        for s in [*idle, session]:
            engine.close_session(s, keep=False)
