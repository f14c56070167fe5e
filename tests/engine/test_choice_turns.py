"""More first-token choices in one step than the pool has rows (n samples started on fewer slots:
one row's logits read for several samplers) are made in turns of at most the pool's rows, as the
device backend's buffers hold one per row; each choice is the one a sampler makes alone."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engine.executor.engine import Engine
from engine.sampling import Sampler, SamplingParams
from tests.support.engines import load


@pytest.fixture(scope="module")
def engine(model_dir: Callable[..., Path]) -> Iterator[Engine]:
    engine = load(model_dir("plain"), max_sessions=2, capacity=128)
    yield engine
    engine.close()


def test_more_choices_than_rows_go_to_the_backend_in_turns_and_equal_one_at_a_time(
    engine: Engine,
) -> None:
    session = engine.open_session()
    try:
        engine.append(session, [5, 6, 7, 8])
        samplers = [Sampler(SamplingParams(temperature=1.0, seed=s)) for s in range(3 * engine.pool.rows + 1)]
        widths: list[int] = []
        choose = engine.backend.choose

        def counted(rows, samplers, histories):  # type: ignore[no-untyped-def]
            widths.append(len(rows))
            return choose(rows, samplers, histories)

        engine.backend.choose = counted  # type: ignore[method-assign]
        try:
            together = engine.choose_rows([session] * len(samplers), samplers)
        finally:
            del engine.backend.choose
        assert max(widths) <= engine.pool.rows and sum(widths) == len(samplers)
        alone = [
            engine.choose_rows([session], [Sampler(SamplingParams(temperature=1.0, seed=s))])[0]
            for s in range(len(samplers))
        ]
        assert together == alone
    finally:
        engine.close_session(session, keep=False)
