"""Decoders that test the refusals: per-token ports, recurrent state, a contracted query axis,
and a supplied port that is not per-token."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from structlog.testing import capture_logs

from engine.errors import InvalidInput
from engine.executor.prefill import widen
from engine.planner.padding import PaddingRefusal
from engine.runtime.cpu import CpuVariant
from tests.support.engines import greedy, load
from tests.support.prompts import prompt_ids


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
    plan = engine.plan(session, 30, ())
    logits = engine.append(session, embeds=embeds, ports=ports)
    assert plan.widths == (44,)
    (entry,) = engine.stats().variants.entries
    assert entry.key.width == 44 and entry.key.ports == ("per_token_features",) and entry.key.batch == 0
    variant = engine.variants._items[entry.key]
    assert isinstance(variant, CpuVariant)
    assert (variant.feed[0, 30:] == embeds[0, 29]).all()
    assert (variant.ports["per_token_features"][0, 30:] == ports["per_token_features"][0, 29]).all()
    exact = load(model_dir("embeddings"), padding=False)
    assert np.abs(exact.append(exact.open_session(), embeds=embeds, ports=ports) - logits).max() <= 1e-5


def test_a_recurrent_state_decoder_is_never_padded_and_chunks_exactly(model_dir) -> None:
    engine = load(model_dir("recurrent"), padding=True)
    chunked = engine.open_session()
    tokens = prompt_ids(150, seed=5)
    plan = engine.plan(chunked, 150)
    assert plan.padding.refusal is PaddingRefusal.RECURRENT_STATE
    assert plan.widths == (64, 64, 22) and plan.padded_rows == 0
    whole_engine = load(model_dir("recurrent"), chunk_size=0)
    whole = whole_engine.open_session()
    a, b = engine.append(chunked, tokens), whole_engine.append(whole, tokens)
    assert np.abs(a - b).max() <= 1e-5
    assert greedy(engine, chunked, 16) == greedy(whole_engine, whole, 16)
    assert chunked.stats.padded_rows == 0


def test_a_recurrent_state_decoder_cannot_rewind_into_its_past(model_dir) -> None:
    engine = load(model_dir("recurrent"))
    session = engine.open_session()
    first = engine.append(session, prompt_ids(20, seed=2))
    with pytest.raises(InvalidInput, match="recurrent state"):
        engine.rewind(session, 10)
    engine.rewind(session, 0)
    assert session.length == 0 and not session.has_logits
    np.testing.assert_array_equal(engine.append(session, prompt_ids(20, seed=2)), first)


def test_a_decoder_that_drops_logits_rows_turns_padding_off_for_good(model_dir) -> None:
    engine = load(model_dir("last_row"), padding=True)
    session = engine.open_session()
    with capture_logs() as logs:
        tokens = greedy(engine, session, 32, prompt_ids(30, seed=9))
        tokens += greedy(engine, session, 8, prompt_ids(37, seed=10))
    assert not session.padding_on
    assert session.stats.self_check_reruns == 1
    assert session.stats.padded_rows == 0
    assert [e["event"] for e in logs].count("padding_off_for_session") == 1
    assert engine.stats().sessions_padding_off == 1
    exact_engine = load(model_dir("last_row"), padding=False)
    exact = exact_engine.open_session()
    expected = greedy(exact_engine, exact, 32, prompt_ids(30, seed=9))
    expected += greedy(exact_engine, exact, 8, prompt_ids(37, seed=10))
    assert tokens == expected


def test_a_port_not_shaped_1_rows_refuses_the_whole_padding_plan(model_dir) -> None:
    engine = load(model_dir("bias_port"), padding=True)
    session = engine.open_session()
    bias = {"embedding_bias": np.full(64, 0.1, np.float32)}
    reports = list(engine.prefill(session, prompt_ids(30, seed=4), ports=bias))
    assert [r.width for r in reports] == [30]
    assert engine.plan(session, 30, ()).padding.allowed  # without the port the same prompt would pad
    exact = load(model_dir("bias_port"), padding=False)
    np.testing.assert_allclose(
        exact.append(exact.open_session(), prompt_ids(30, seed=4), ports=bias),
        engine.logits(session),
        atol=1e-6,
    )


def test_a_missing_or_unknown_port_is_invalid_input(model_dir) -> None:
    engine = load(model_dir("bias_port"))
    session = engine.open_session()
    with pytest.raises(InvalidInput, match="missing"):
        engine.append(session, prompt_ids(5))
    with pytest.raises(InvalidInput, match="unknown"):
        engine.append(session, prompt_ids(5), ports={"embedding_bias": np.zeros(64), "x": np.zeros(1)})


def test_a_rewind_on_a_decoder_with_supplied_ports_leaves_the_session_consistent(model_dir) -> None:
    engine = load(model_dir("bias_port"))
    session = engine.open_session()
    bias = {"embedding_bias": np.full(64, 0.1, np.float32)}
    tokens = prompt_ids(20, seed=4)
    held = engine.append(session, tokens, ports=bias)
    try:
        engine.rewind(session, 10)
    except InvalidInput:  # refused: nothing moved
        assert session.length == len(session.tokens) == 20
        np.testing.assert_array_equal(engine.logits(session), held)
    else:  # done: ten tokens kept, and next-token logits only if they are those of the ten
        assert session.length == 10 and session.tokens == tokens[:10]
        if session.has_logits:
            exact = load(model_dir("bias_port"))
            np.testing.assert_allclose(
                engine.logits(session), exact.append(exact.open_session(), tokens[:10], ports=bias), atol=1e-5
            )
    # Either way the session takes the rest of its prompt again.
    again = engine.append(session, tokens[session.length :], ports=bias)
    np.testing.assert_allclose(again, held, atol=1e-5)


def test_a_model_config_without_its_model_object_names_the_file_and_the_key(tmp_path: Path) -> None:
    from engine.errors import ModelUnreadable
    from engine.model import load_model_info

    (tmp_path / "genai_config.json").write_text('{"search": {}}')
    with pytest.raises(ModelUnreadable, match=r"genai_config.json has no 'model' object"):
        load_model_info(tmp_path)
