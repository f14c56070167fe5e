"""The seed's claims, end to end on real onnxruntime sessions over generated decoders."""

from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import pytest

from engine.errors import Exhausted, InvalidInput, OverCapacity
from engine.executor import DecodeRow
from engine.executor.engine import variant_bytes_estimate
from engine.modelgen.reference import reference_logits
from engine.modelgen.synthetic import VARIANTS, random_weights
from engine.planner import batch_widths
from tests.support.engines import greedy, load
from tests.support.prompts import prompt_ids

LENGTHS = (2, 23, 64, 100, 150, 301)


@pytest.mark.parametrize("packed", [False, True], ids=["separate", "packed-qkv-gate-up"])
def test_the_generated_decoder_matches_its_numpy_reference(model_dir, packed) -> None:
    spec = replace(VARIANTS["plain"], packed_projections=packed)
    engine = load(model_dir(spec=spec), chunk_size=0, padding=False)
    tokens = prompt_ids(40, seed=3)
    logits = engine.append(engine.open_session(), tokens)
    expected = reference_logits(spec, random_weights(spec), tokens)[-1]
    np.testing.assert_allclose(logits, expected, atol=1e-4)


@pytest.mark.parametrize("length", LENGTHS)
def test_chunked_prefill_gives_the_logits_and_kv_of_one_whole_prompt_forward(model_dir, length) -> None:
    chunked, whole = load(model_dir(), padding=True), load(model_dir(), chunk_size=0, padding=False)
    a_session, b_session = chunked.open_session(), whole.open_session()
    tokens = prompt_ids(length, seed=length)
    a, b = chunked.append(a_session, tokens), whole.append(b_session, tokens)
    assert np.abs(a - b).max() <= 1e-5
    for layer in range(chunked.info.num_layers):
        for which in (0, 1):  # key, value: [kv_heads, capacity, head] per row
            ka = chunked.pool.layer(layer, which)[a_session.row]
            kb = whole.pool.layer(layer, which)[b_session.row]
            np.testing.assert_allclose(ka[:, :length], kb[:, :length], atol=1e-5)


@pytest.mark.parametrize("length", LENGTHS)
def test_padded_and_unpadded_greedy_output_is_identical_over_two_turns(model_dir, length) -> None:
    runs = []
    for padding in (True, False):
        engine = load(model_dir(), padding=padding)
        session = engine.open_session()
        first = greedy(engine, session, 32, prompt_ids(length, seed=length))
        second = greedy(engine, session, 32, prompt_ids(37, seed=length + 1))
        runs.append((first, second, session.stats.padded_rows))
    (first_on, second_on, padded), (first_off, second_off, unpadded) = runs
    assert first_on == first_off
    assert second_on == second_off
    assert unpadded == 0
    assert padded > 0 or length in (64,)


def test_padded_rows_are_never_read_even_when_the_kv_cache_holds_nan(model_dir) -> None:
    engine = load(model_dir(), padding=True)
    engine.pool.block.fill(np.nan)  # every row, every position: only what a forward writes is a number
    session = engine.open_session()
    logits = engine.append(session, prompt_ids(140, seed=7))
    assert session.stats.padded_rows > 0
    for _ in range(5):
        assert np.isfinite(logits).all()
        logits = engine.append(session, prompt_ids(30, seed=int(np.argmax(logits))))
    assert np.isfinite(logits).all()


def test_rewind_restores_the_next_token_logits_and_continuing_reproduces_the_continuation(model_dir) -> None:
    engine = load(model_dir())
    session = engine.open_session()
    after_prompt = engine.append(session, prompt_ids(90, seed=11))
    first = greedy(engine, session, 20)
    engine.rewind(session, 90)
    assert session.length == 90 and len(session.tokens) == 90
    np.testing.assert_allclose(engine.logits(session), after_prompt, atol=1e-5)
    assert greedy(engine, session, 20) == first


def test_the_inference_metadata_chunk_size_wins_over_search_chunk_size(model_dir, tmp_path) -> None:
    target = tmp_path / "model"
    shutil.copytree(model_dir(), target)
    (target / "inference_metadata.yaml").write_text(
        "runtime_configurable:\n  chunked_prefill:\n    chunk_size: 32\n"
    )
    engine = load(target)
    assert engine.chunk_size == 32
    assert engine.ladder == (16, 32)


def test_a_prompt_over_capacity_is_out_of_range_and_the_session_stays_usable(model_dir) -> None:
    engine = load(model_dir(), capacity=128)
    session = engine.open_session()
    engine.append(session, prompt_ids(100))
    with pytest.raises(OverCapacity):
        engine.append(session, prompt_ids(29))
    assert session.length == 100
    assert np.isfinite(engine.append(session, prompt_ids(28))).all()


def test_bad_token_ids_and_empty_prompts_are_invalid_input(model_dir) -> None:
    engine = load(model_dir())
    session = engine.open_session()
    with pytest.raises(InvalidInput, match="outside the vocabulary"):
        engine.append(session, [1, 2, 512])
    with pytest.raises(InvalidInput):
        engine.append(session, [])
    assert session.length == 0


def test_sessions_beyond_the_slot_pool_are_refused_and_closed_slots_are_reused(model_dir) -> None:
    engine = load(model_dir(), max_sessions=2)
    first, second = engine.open_session(), engine.open_session()
    with pytest.raises(Exhausted):
        engine.open_session()
    engine.append(first, prompt_ids(10))
    engine.close_session(first)
    third = engine.open_session()
    assert third.row == first.row
    assert third.length == 0 and engine.stats().slots_allocated == 2
    np.testing.assert_allclose(
        engine.append(third, prompt_ids(10)), engine.append(second, prompt_ids(10)), atol=1e-6
    )


def _reserve(engine, rows: int) -> int:
    """The variant bytes a pool of `rows` plans for: every ladder width and every batch width."""
    return sum(variant_bytes_estimate(engine.info, w) for w in engine.ladder) + sum(
        variant_bytes_estimate(engine.info, 1, b) for b in batch_widths(rows)
    )


def test_the_kv_pool_is_allocated_up_front_with_max_sessions_rows(model_dir) -> None:
    engine = load(model_dir(), max_sessions=5)
    use = engine.memory()
    assert use.weights > 0 and use.variants == 0
    assert engine.stats().slots_allocated == engine.pool.rows == 5
    assert use.kv == 5 * engine.slot_bytes
    engine.append(engine.open_session(), prompt_ids(100))
    assert engine.memory().kv == use.kv  # opening and filling a session allocates no KV


def test_the_memory_budget_sizes_the_pool_at_load_by_weights_kv_and_variants(model_dir) -> None:
    probe = load(model_dir())
    weights = probe.memory().weights
    # Room for the weights, every variant a two-row pool plans, and exactly two rows' KV.
    budget = weights + _reserve(probe, 2) + 2 * probe.slot_bytes + 1000
    engine = load(model_dir(), memory_budget_bytes=budget, max_sessions=8)
    assert engine.stats().slots_allocated == 2 and engine.batch_widths == (1, 2)
    assert engine.memory().kv == 2 * engine.slot_bytes
    first, second = engine.open_session(), engine.open_session()
    with pytest.raises(Exhausted):
        engine.open_session()
    # Every planned shape: the three ladder widths, then decode at batch 2 and at batch 1.
    engine.append(first, prompt_ids(100))  # 64 + 36 -> widths 64, 44
    engine.append(second, prompt_ids(10))  # width 22
    engine.decode([DecodeRow(first, 1), DecodeRow(second, 2)])
    engine.close_session(second)
    greedy(engine, first, 3)
    assert len(engine.stats().variants.entries) == len(engine.ladder) + 2
    assert engine.memory().variants <= _reserve(engine, 2)
    assert engine.memory().total <= budget
    assert engine.open_session().row == second.row  # a freed row needs no new memory
    assert engine.memory().kv == 2 * engine.slot_bytes


def test_a_memory_budget_that_cannot_hold_one_session_refuses_to_load(model_dir) -> None:
    probe = load(model_dir())
    one_row = probe.memory().weights + _reserve(probe, 1) + probe.slot_bytes
    assert load(model_dir(), memory_budget_bytes=one_row).pool.rows == 1
    with pytest.raises(Exhausted, match="memory budget"):
        load(model_dir(), memory_budget_bytes=one_row - 1)
