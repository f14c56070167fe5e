"""Decoders that test the refusals: per-token ports, recurrent state, a contracted query axis,
and a supplied port that is not per-token."""

from __future__ import annotations

import numpy as np
import pytest
from structlog.testing import capture_logs

from engine.errors import InvalidInput
from engine.executor.session import widen
from engine.planner.padding import PaddingRefusal
from tests.engine.helpers import greedy, load, prompt


def _embeds(rows: int, seed: int = 0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    embeds = rng.standard_normal((1, rows, 64), dtype=np.float32)
    return embeds, {"per_token_features": rng.standard_normal((1, rows, 8), dtype=np.float32)}


def test_widening_repeats_the_last_real_row() -> None:
    rows = np.arange(2 * 3 * 2, dtype=np.float32).reshape(1, 6, 2)[:, :3]
    wide = widen(rows, 3, 5)
    assert wide.shape == (1, 5, 2)
    assert (wide[0, 3:] == rows[0, 2]).all()


def test_an_embeddings_fed_decoder_pads_embeddings_and_ports_by_repeating_the_last_row(model_dir) -> None:
    engine = load(model_dir("embeddings"), padding=True)
    session = engine.open_session()
    embeds, ports = _embeds(30)
    plan = session.plan(30, ())
    logits = session.append(embeds=embeds, ports=ports)
    assert plan.widths == (44,)
    (entry,) = engine.stats().variants.entries
    assert entry.key.width == 44 and entry.key.ports == ("per_token_features",)
    variant = engine.variants._items[entry.key]
    assert (variant.feed[0, 30:] == embeds[0, 29]).all()
    assert (variant.ports["per_token_features"][0, 30:] == ports["per_token_features"][0, 29]).all()
    exact = load(model_dir("embeddings"), padding=False).open_session()
    assert np.abs(exact.append(embeds=embeds, ports=ports) - logits).max() <= 1e-5


def test_a_recurrent_state_decoder_is_never_padded_and_chunks_exactly(model_dir) -> None:
    chunked = load(model_dir("recurrent"), padding=True).open_session()
    tokens = prompt(150, seed=5)
    plan = chunked.plan(150)
    assert plan.padding.refusal is PaddingRefusal.RECURRENT_STATE
    assert plan.widths == (64, 64, 22) and plan.padded_rows == 0
    whole = load(model_dir("recurrent"), chunk_size=0).open_session()
    a, b = chunked.append(tokens), whole.append(tokens)
    assert np.abs(a - b).max() <= 1e-5
    assert greedy(chunked, a, 16) == greedy(whole, b, 16)
    assert chunked.stats.padded_rows == 0


def test_a_recurrent_state_decoder_cannot_rewind_into_its_past(model_dir) -> None:
    session = load(model_dir("recurrent")).open_session()
    first = session.append(prompt(20, seed=2))
    with pytest.raises(InvalidInput, match="recurrent state"):
        session.rewind_to(10)
    session.rewind_to(0)
    np.testing.assert_array_equal(session.append(prompt(20, seed=2)), first)


def test_a_decoder_that_drops_logits_rows_turns_padding_off_for_good(model_dir) -> None:
    engine = load(model_dir("last_row"), padding=True)
    session = engine.open_session()
    with capture_logs() as logs:
        logits = session.append(prompt(30, seed=9))
        tokens = greedy(session, logits, 32)
        tokens += greedy(session, session.append(prompt(37, seed=10)), 8)
    assert not session.padding_on
    assert session.stats.self_check_reruns == 1
    assert session.stats.padded_rows == 0
    assert [e["event"] for e in logs].count("padding_off_for_session") == 1
    assert engine.stats().sessions_padding_off == 1
    exact = load(model_dir("last_row"), padding=False).open_session()
    expected = greedy(exact, exact.append(prompt(30, seed=9)), 32)
    expected += greedy(exact, exact.append(prompt(37, seed=10)), 8)
    assert tokens == expected


def test_a_port_not_shaped_1_rows_refuses_the_whole_padding_plan(model_dir) -> None:
    engine = load(model_dir("bias_port"), padding=True)
    session = engine.open_session()
    bias = {"embedding_bias": np.full(64, 0.1, np.float32)}
    reports = list(session.prefill(prompt(30, seed=4), ports=bias))
    assert [r.width for r in reports] == [30]
    assert session.plan(30, ()).padding.allowed  # without the port the same prompt would pad
    exact = load(model_dir("bias_port"), padding=False).open_session()
    np.testing.assert_allclose(exact.append(prompt(30, seed=4), ports=bias), reports[-1].logits,
                               atol=1e-6)


def test_a_missing_or_unknown_port_is_invalid_input(model_dir) -> None:
    session = load(model_dir("bias_port")).open_session()
    with pytest.raises(InvalidInput, match="missing"):
        session.append(prompt(5))
    with pytest.raises(InvalidInput, match="unknown"):
        session.append(prompt(5), ports={"embedding_bias": np.zeros(64), "x": np.zeros(1)})
