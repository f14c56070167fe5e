"""The exactness rules follow what this machine's kernels do, measured when the model loads
(engine/executor/kernels.py), so the exactness promises hold on every CPU onnxruntime runs on."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from engine.executor.engine import Engine
from engine.executor.kernels import probe_ids
from tests.support.engines import load_default


@pytest.fixture(scope="module")
def engine(default_model: Callable[..., Path]) -> Iterator[Engine]:
    engine = load_default(default_model("int4"), max_sessions=4, capacity=1024)
    yield engine
    engine.close()


def decode_logits(engine: Engine, least: int) -> np.ndarray:
    """A row's logits after one decode forward of at least `least` pool rows."""
    ids = probe_ids(engine.info.vocab_size)
    session = engine.open_session()
    try:
        engine.append(session, ids)
        engine.decoder.forward({session.row: ids[1]}, least=least)
        return np.array(engine.logits(session))
    finally:
        engine.close_session(session, keep=False)


def test_a_cpu_engine_takes_its_rules_from_a_measurement(engine: Engine) -> None:
    rules = engine.kernels
    assert rules.measured
    assert rules.fresh_forwards == (rules.re_run_gap > 0.0)
    assert rules.least_decode_batch == (2 if rules.one_row_gap > 0.0 else 1)
    assert engine.stats().kernels == rules


def test_no_decode_forward_is_narrower_than_the_rules_allow(engine: Engine) -> None:
    assert engine.batch_widths and min(engine.batch_widths) >= engine.kernels.least_decode_batch
    assert engine.facts.batch_widths == engine.batch_widths


def test_a_row_decoded_in_the_narrowest_forward_equals_the_row_decoded_beside_another(engine: Engine) -> None:
    """The promise the rule exists for: no row decodes alone where that changes its logits, so a
    session's tokens do not depend on whether another session decodes beside it, on any CPU."""
    narrowest = min(engine.batch_widths)
    np.testing.assert_array_equal(decode_logits(engine, narrowest), decode_logits(engine, 2))


def test_the_probe_leaves_no_session_or_held_prefix_behind(engine: Engine) -> None:
    assert engine.sessions_open == 0
    assert engine.stats().prefix.rows_held == 0
