"""Batched decode: sessions at any lengths advance together in one forward over the first B
pool rows, and each gives exactly what it gives alone on a fresh engine.

Real onnxruntime on generated decoders. A "decoded alone" reference is always a
fresh engine holding only that session (pool row 0, decode batch 1).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.errors import OverCapacity
from engine.executor import DecodeRow, Session
from engine.executor.engine import Engine
from engine.sampling import Sampler, SamplingParams
from tests.support.engines import load
from tests.support.prompts import prompt_ids

GREEDY = SamplingParams()
SEEDED = SamplingParams(temperature=0.8, top_k=20, seed=7)
LENGTHS = (1, 7, 30, 100, 250)
STEPS = 10


class Batch:
    """Sessions decoding together, one engine.decode call per step, each with its own sampler."""

    def __init__(self, engine: Engine, params: SamplingParams = GREEDY) -> None:
        self.engine, self.params = engine, params
        self.sessions: dict[str, Session] = {}
        self.samplers: dict[str, Sampler] = {}
        self.tokens: dict[str, list[int]] = {}
        self.prompts: dict[str, list[int]] = {}

    def join(self, name: str, tokens: list[int]) -> Session:
        """Open a session, prefill it and choose its first token (between other sessions' steps)."""
        session = self.sessions[name] = self.engine.open_session()
        self.prompts[name] = tokens
        self.engine.append(session, tokens)
        self.samplers[name] = Sampler(self.params)
        self.tokens[name] = [self.engine.choose(session, self.samplers[name])]
        return session

    def leave(self, name: str) -> None:
        self.engine.close_session(self.sessions.pop(name))

    def step(self, steps: int = 1) -> None:
        for _ in range(steps):
            names = list(self.sessions)
            rows = [DecodeRow(self.sessions[n], self.tokens[n][-1], self.samplers[n]) for n in names]
            for name, token in zip(names, self.engine.decode(rows), strict=True):
                assert token is not None
                self.tokens[name].append(token)

    def expect_alone(self, model: Path, **options: object) -> None:
        """Every session's tokens, left or still open, equal it decoded alone on a fresh engine."""
        for name, tokens in self.tokens.items():
            alone = decode_alone(model, self.prompts[name], len(tokens), self.params, **options)
            assert tokens == alone, name


def decode_alone(
    model: Path, tokens: list[int], steps: int, params: SamplingParams = GREEDY, **options: object
) -> list[int]:
    """`steps` tokens continuing `tokens`, the only session on a fresh engine."""
    batch = Batch(load(model, **options), params)
    batch.join("alone", tokens)
    batch.step(steps - 1)
    assert batch.sessions["alone"].row == 0
    return batch.tokens["alone"]


@pytest.mark.parametrize("hole", [False, True], ids=["packed-rows", "closed-low-row"])
def test_sessions_of_different_lengths_decode_together_to_the_tokens_each_gives_alone(
    model_dir, hole
) -> None:
    engine = load(model_dir())
    batch = Batch(engine)
    for i, length in enumerate(LENGTHS):
        batch.join(f"len{length}", prompt_ids(length, seed=length))
        if hole and i == 0:
            batch.join("gone", prompt_ids(40, seed=99))  # row 1, closed below: a hole that rides along
    if hole:
        assert batch.sessions["gone"].row == 1
        batch.leave("gone")
        del batch.tokens["gone"]
    before = engine.stats().decode  # the one-token prompt was a decode forward of its own
    batch.step(STEPS)
    after = engine.stats().decode
    assert after.steps - before.steps == STEPS
    assert after.rows - before.rows == STEPS * len(LENGTHS)
    # Five rows bind batch 8 (the highest row is 4, or 5 behind a hole): the rest ride along.
    assert dict(after.widths)[8] - dict(before.widths).get(8, 0) == STEPS
    assert after.ride_along_rows - before.ride_along_rows == STEPS * (8 - len(LENGTHS))
    batch.expect_alone(model_dir())


def test_sessions_joining_and_leaving_between_steps_decode_as_each_would_alone(model_dir) -> None:
    engine = load(model_dir())
    batch = Batch(engine)
    for length in (30, 100, 7):
        batch.join(f"a{length}", prompt_ids(length, seed=length))  # rows 0, 1, 2
    batch.step(4)
    batch.leave("a30")  # row 0 becomes a hole; two rows decode in a forward of two:
    batch.step(3)  # a7 moves down from row 2 into it (Engine.compact)
    assert batch.join("b250", prompt_ids(250, seed=250)).row == 2  # joins the lowest free row
    batch.step(2)
    assert batch.join("b1", prompt_ids(1, seed=1)).row == 3  # a one-token prompt: itself a decode forward
    batch.step(3)
    batch.leave("a100")
    batch.leave("a7")  # only rows 2 and 3 remain: both move down into rows 0 and 1
    batch.step(4)
    assert batch.join("c60", prompt_ids(60, seed=60)).row == 2
    batch.step(3)
    assert {w for w, _ in engine.stats().decode.widths} <= set(engine.batch_widths)
    assert engine.stats().decode.rows_moved == 3
    batch.expect_alone(model_dir())


def test_a_full_session_riding_along_keeps_its_logits_and_continues_as_on_a_fresh_engine(model_dir) -> None:
    model = model_dir()
    engine = load(model, capacity=128)
    assert engine.capacity == 128
    full = engine.open_session()  # row 0: in every batch the other rows bind
    tokens = prompt_ids(128, seed=128)
    held = engine.append(full, tokens)
    assert full.length == engine.capacity
    batch = Batch(engine)
    for length in (5, 40, 90):
        batch.join(f"len{length}", prompt_ids(length, seed=length))
    batch.step(8)
    assert engine.stats().decode.ride_along_rows >= 8
    np.testing.assert_array_equal(engine.logits(full), held)
    with pytest.raises(OverCapacity):
        engine.decode([DecodeRow(full, 0)])

    fresh = load(model, capacity=128)
    reference = fresh.open_session()
    # Rewound by one, its last position (rewritten by every ride-along) is written again.
    engine.rewind(full, 127)
    fresh.append(reference, tokens[:127])
    np.testing.assert_allclose(engine.logits(full), fresh.logits(reference), atol=1e-5)
    engine.decode([DecodeRow(full, tokens[127])])
    np.testing.assert_allclose(engine.logits(full), held, atol=1e-5)
    # Rewound further and continued next to the others, it decodes as on a fresh engine.
    engine.rewind(full, 100)
    batch.sessions["full"], batch.prompts["full"] = full, tokens[:100]
    batch.samplers["full"] = Sampler(GREEDY)
    batch.tokens["full"] = [engine.choose(full, batch.samplers["full"])]
    batch.step(20)
    batch.expect_alone(model, capacity=128)  # "full" against tokens[:100] alone, the others too


def test_kv_outside_every_rows_length_never_reaches_batched_logits_even_as_nan(model_dir) -> None:
    engine = load(model_dir())
    engine.pool.block.fill(np.nan)  # before any forward: only what a forward writes is a number
    batch = Batch(engine)
    for length in LENGTHS:
        batch.join(f"len{length}", prompt_ids(length, seed=length))
    batch.join("gone", prompt_ids(20, seed=20))
    batch.join("idle", prompt_ids(70, seed=70))  # holds logits, rides along, never decodes
    batch.leave("gone")
    del batch.tokens["gone"]
    idle = batch.sessions.pop("idle")
    del batch.tokens["idle"]
    for _ in range(STEPS):
        batch.step()
        for session in (*batch.sessions.values(), idle):
            assert np.isfinite(engine.logits(session)).all()
    assert engine.stats().decode.ride_along_rows > 0
    batch.expect_alone(model_dir())


def test_after_warm_up_any_number_of_sessions_decodes_without_preparing_a_variant(model_dir) -> None:
    engine = load(model_dir(), max_sessions=6)
    assert engine.batch_widths == (1, 2, 4, 6)
    # Warm-up: each ladder width once, one decode step at every batch width.
    warm = []
    for length in (10, 30, 50, 70, 90, 130):  # widths 22, 44, 64 (and chunks of them)
        warm.append(engine.open_session())
        engine.append(warm[-1], prompt_ids(length, seed=length))
        engine.decode([DecodeRow(s, 1) for s in warm])
    for session in warm:
        engine.close_session(session)
    prepared = engine.stats().variants.prepared
    assert prepared == len(engine.ladder) + len(engine.batch_widths)

    rng = np.random.default_rng(0)
    for count in range(1, engine.pool.rows + 1):
        for _ in range(3):
            sessions = [engine.open_session() for _ in range(engine.pool.rows)]
            for session in sessions:
                engine.append(session, prompt_ids(int(rng.integers(1, 200)), seed=int(rng.integers(1 << 30))))
            keep = sorted(rng.choice(len(sessions), count, replace=False))
            for i, session in enumerate(sessions):
                if i not in keep:
                    engine.close_session(session)
            decoding = [sessions[i] for i in keep]
            for _ in range(3):
                engine.decode([DecodeRow(s, int(rng.integers(512))) for s in decoding])
            stats = engine.stats().variants
            assert (stats.prepared, stats.evictions) == (prepared, 0), (count, keep)
            for session in decoding:
                engine.close_session(session)
    keys = [e.key for e in engine.stats().variants.entries]
    assert {k.batch for k in keys if k.batch} == set(engine.batch_widths)
    assert {k.width for k in keys if not k.batch} == set(engine.ladder)
    assert {w for w, _ in engine.stats().decode.widths} == set(engine.batch_widths)


def test_a_recurrent_decoder_decodes_each_session_alone_and_exactly(model_dir) -> None:
    model = model_dir("recurrent")
    engine = load(model)
    stats = engine.stats()
    assert stats.unbatched_reason and stats.batch_widths == ()
    batch = Batch(engine)
    alone: dict[str, tuple[Engine, Session]] = {}
    for length in LENGTHS:
        name = f"len{length}"
        batch.join(name, prompt_ids(length, seed=length))
        single = load(model)
        alone[name] = (single, single.open_session())
        single.append(alone[name][1], prompt_ids(length, seed=length))
    for _ in range(STEPS):
        fed = {n: batch.tokens[n][-1] for n in batch.sessions}
        batch.step()  # one engine.decode call for all five sessions
        for name, (single, session) in alone.items():
            single.decode([DecodeRow(session, fed[name])])
            np.testing.assert_array_equal(engine.logits(batch.sessions[name]), single.logits(session))
    stats = engine.stats()
    assert stats.decode.steps == 0 and stats.decode.widths == ()
    assert all(e.key.batch == 0 for e in stats.variants.entries)
    batch.expect_alone(model)


def test_seeded_sampling_draws_the_same_tokens_alone_and_inside_a_batch(model_dir) -> None:
    batch = Batch(load(model_dir()), SEEDED)
    for length in LENGTHS:
        batch.join(f"len{length}", prompt_ids(length, seed=length))
    batch.step(20)
    greedy = {n: decode_alone(model_dir(), batch.prompts[n], 21) for n in batch.tokens}
    assert any(batch.tokens[n] != greedy[n] for n in batch.tokens), "the sampler really samples"
    batch.expect_alone(model_dir())


@pytest.mark.parametrize("feed", ["decode", "append"])
def test_rewinding_restores_the_next_token_logits_of_the_tokens_kept(model_dir, feed) -> None:
    engine = load(model_dir())
    session = engine.open_session()
    start = prompt_ids(50, seed=3)
    seen = [engine.append(session, start)]  # seen[i]: next-token logits after 50 + i tokens
    for _ in range(20):
        token = int(np.argmax(seen[-1]))
        if feed == "decode":
            engine.decode([DecodeRow(session, token)])
        else:
            engine.append(session, [token])
        seen.append(engine.logits(session))
    held = list(session.tokens)
    assert session.length == len(held) == 70
    for keep in (65, 56, 50, 51):  # each rewind after continuing again from the one before
        engine.rewind(session, keep)
        assert session.length == keep and session.tokens == held[:keep]
        np.testing.assert_allclose(engine.logits(session), seen[keep - 50], atol=1e-5)
        for token in held[keep:]:  # continuing reproduces the earlier continuation
            assert int(np.argmax(engine.logits(session))) == token
            engine.decode([DecodeRow(session, token)])
        assert session.tokens == held
    engine.rewind(session, 31)
    fresh = load(model_dir())
    np.testing.assert_allclose(
        engine.logits(session), fresh.append(fresh.open_session(), start[:31]), atol=1e-5
    )
    engine.rewind(session, 0)
    assert session.length == 0 and not session.has_logits
    with pytest.raises(OverCapacity):
        engine.logits(session)


@pytest.mark.parametrize("span", [22, 44])
def test_a_prompt_prefilled_in_smaller_spans_gives_the_logits_of_whole_chunks(
    model_dir: Path, span: int
) -> None:
    engine = load(model_dir(), capacity=512)
    whole, spanned = engine.open_session(), engine.open_session()
    tokens = prompt_ids(300, seed=12)
    reference = engine.append(whole, tokens)
    task = engine.start_prefill(spanned, tokens)
    widths = []
    while not task.done:
        widths.append(engine.prefill_step(task, span).width)
    assert set(widths) <= set(engine.ladder) and len(widths) == -(-300 // span)
    assert np.abs(engine.logits(spanned) - reference).max() <= 1e-5
    assert spanned.tokens == whole.tokens == tokens


def test_a_seeded_session_draws_the_same_tokens_alone_beside_63_others_and_beside_different_ones(
    model_dir,
) -> None:
    """Draws are counter-based (engine.sampling): keyed by the seed, counted by position. What shares
    the step, and how many rows do, changes no seeded session's tokens."""
    mine = prompt_ids(40, seed=1)

    def tokens_beside(others: list[tuple[list[int], SamplingParams]]) -> list[int]:
        engine = load(model_dir(), max_sessions=64)
        batch = Batch(engine, SEEDED)
        batch.join("mine", mine)
        for i, (prompt, params) in enumerate(others):
            batch.params = params
            batch.join(f"other{i}", prompt)
        batch.step(12)
        return batch.tokens["mine"]

    alone = tokens_beside([])
    mixed = [SEEDED, GREEDY, SamplingParams(temperature=1.3, top_p=0.8, seed=3)]
    beside = tokens_beside([(prompt_ids(5 + i, seed=100 + i), mixed[i % 3]) for i in range(63)])
    cold = SamplingParams(temperature=0.5, min_p=0.1, seed=9)
    different = tokens_beside([(prompt_ids(30, seed=7), cold)] * 4)
    assert alone == beside == different
    assert alone != decode_alone(model_dir(), mine, 13), "the sampler really samples"
