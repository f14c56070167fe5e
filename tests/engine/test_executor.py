"""The seed's claims, end to end on real onnxruntime sessions over generated decoders."""

from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import pytest

from engine.errors import Exhausted, InvalidInput, OutOfRange
from engine.executor.engine import variant_bytes_estimate
from engine.modelgen.reference import reference_logits
from engine.modelgen.synthetic import VARIANTS, random_weights
from tests.engine.helpers import greedy, load, prompt

LENGTHS = (2, 23, 64, 100, 150, 301)


@pytest.mark.parametrize("packed", [False, True], ids=["separate", "packed-qkv-gate-up"])
def test_the_generated_decoder_matches_its_numpy_reference(model_dir, packed) -> None:
    spec = replace(VARIANTS["plain"], packed_projections=packed)
    engine = load(model_dir(spec=spec), chunk_size=0, padding=False)
    tokens = prompt(40, seed=3)
    session = engine.open_session()
    logits = session.append(tokens)
    expected = reference_logits(spec, random_weights(spec), tokens)[-1]
    np.testing.assert_allclose(logits, expected, atol=1e-4)


@pytest.mark.parametrize("length", LENGTHS)
def test_chunked_prefill_gives_the_logits_and_kv_of_one_whole_prompt_forward(model_dir, length) -> None:
    chunked = load(model_dir(), padding=True).open_session()
    whole = load(model_dir(), chunk_size=0, padding=False).open_session()
    tokens = prompt(length, seed=length)
    a, b = chunked.append(tokens), whole.append(tokens)
    assert np.abs(a - b).max() <= 1e-5
    for (ka, va), (kb, vb) in zip(chunked.slot.kv, whole.slot.kv, strict=True):
        np.testing.assert_allclose(ka[:, :, :length], kb[:, :, :length], atol=1e-5)
        np.testing.assert_allclose(va[:, :, :length], vb[:, :, :length], atol=1e-5)


@pytest.mark.parametrize("length", LENGTHS)
def test_padded_and_unpadded_greedy_output_is_identical_over_two_turns(model_dir, length) -> None:
    runs = []
    for padding in (True, False):
        session = load(model_dir(), padding=padding).open_session()
        first = greedy(session, session.append(prompt(length, seed=length)), 32)
        second = greedy(session, session.append(prompt(37, seed=length + 1)), 32)
        runs.append((first, second, session.stats.padded_rows))
    (first_on, second_on, padded), (first_off, second_off, unpadded) = runs
    assert first_on == first_off
    assert second_on == second_off
    assert unpadded == 0
    assert padded > 0 or length in (64,)


def test_padded_rows_are_never_read_even_when_the_kv_cache_holds_nan(model_dir) -> None:
    engine = load(model_dir(), padding=True)
    session = engine.open_session()
    for key, value in session.slot.kv:
        key.fill(np.nan)
        value.fill(np.nan)
    logits = session.append(prompt(140, seed=7))
    assert session.stats.padded_rows > 0
    for _ in range(5):
        assert np.isfinite(logits).all()
        logits = session.append(prompt(30, seed=int(np.argmax(logits))))
    assert np.isfinite(logits).all()


def test_rewind_then_continue_reproduces_the_same_continuation(model_dir) -> None:
    session = load(model_dir()).open_session()
    logits = session.append(prompt(90, seed=11))
    first = greedy(session, logits.copy(), 20)
    session.rewind_to(90)
    assert session.length == 90 and len(session.tokens) == 90
    again = greedy(session, session.append(first[:1]), 19)
    assert again == first[1:]


def test_the_inference_metadata_chunk_size_wins_over_search_chunk_size(model_dir, tmp_path) -> None:
    target = tmp_path / "model"
    shutil.copytree(model_dir(), target)
    (target / "inference_metadata.yaml").write_text(
        "runtime_configurable:\n  chunked_prefill:\n    chunk_size: 32\n")
    engine = load(target)
    assert engine.chunk_size == 32
    assert engine.ladder == (16, 32)


def test_a_prompt_over_capacity_is_out_of_range_and_the_session_stays_usable(model_dir) -> None:
    engine = load(model_dir(), capacity=128)
    session = engine.open_session()
    session.append(prompt(100))
    with pytest.raises(OutOfRange):
        session.append(prompt(29))
    assert session.length == 100
    assert np.isfinite(session.append(prompt(28))).all()


def test_bad_token_ids_and_empty_prompts_are_invalid_input(model_dir) -> None:
    session = load(model_dir()).open_session()
    with pytest.raises(InvalidInput, match="outside the vocabulary"):
        session.append([1, 2, 512])
    with pytest.raises(InvalidInput):
        session.append([])
    assert session.length == 0


def test_sessions_beyond_the_slot_pool_are_refused_and_closed_slots_are_reused(model_dir) -> None:
    engine = load(model_dir(), max_sessions=2)
    first, second = engine.open_session(), engine.open_session()
    with pytest.raises(Exhausted):
        engine.open_session()
    first.append(prompt(10))
    first.close()
    third = engine.open_session()
    assert third.slot_index == first.slot_index
    assert third.length == 0 and engine.stats().slots_allocated == 2
    np.testing.assert_allclose(third.append(prompt(10)), second.append(prompt(10)), atol=1e-6)


def test_the_memory_budget_admits_sessions_by_weights_kv_and_variants(model_dir) -> None:
    probe = load(model_dir())
    use = probe.memory()
    assert use.weights > 0 and use.kv == 0 and use.variants == 0
    # Room for the weights, a full variant cache and exactly two sessions' KV.
    full_cache = sum(variant_bytes_estimate(probe.info, w) for w in (*probe.ladder, 1))
    budget = use.weights + full_cache + 2 * probe.slot_bytes + 1000
    engine = load(model_dir(), memory_budget_bytes=budget, max_sessions=8)
    first, second = engine.open_session(), engine.open_session()
    first.append(prompt(100))
    with pytest.raises(Exhausted, match="memory budget"):
        engine.open_session()
    assert engine.memory().kv == 2 * engine.slot_bytes
    assert engine.memory().total <= budget
    second.close()
    assert engine.open_session().slot_index == second.slot_index  # a freed slot needs no new memory
