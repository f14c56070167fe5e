"""Engine.step on a real engine (a generated model on onnxruntime): the one way a scheduler drives it.

A step runs its session operations, opens, prefill forwards, one batched choice of first tokens
and one decode forward; each item fails alone; the bookkeeping invariants hold after every step.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.errors import EngineFault, InvalidInput, OverCapacity
from engine.executor import Session
from engine.executor.engine import Engine
from engine.executor.step import (
    Choose,
    Close,
    DecodeRow,
    Fork,
    Open,
    Prefill,
    PrefillProgress,
    Rewind,
    Stats,
    Step,
)
from engine.sampling import Sampler, SamplingParams
from tests.support.engines import load
from tests.support.prompts import prompt_ids


def greedy() -> Sampler:
    return Sampler(SamplingParams())


def prefill_all(
    engine: Engine,
    session: Session,
    tokens: list[int],
    samplers: tuple[Sampler, ...] = (),
    copies: tuple[Session, ...] = (),
) -> PrefillProgress:
    request = Prefill(session, tuple(tokens), copies=copies, samplers=samplers)
    while True:
        [outcome] = engine.step(Step(prefills=((request, 0),))).prefills
        progress: PrefillProgress = outcome.get()
        if progress.done:
            return progress
        request = replace(request, task=progress.task)


def test_a_prefill_step_chooses_the_first_token_the_engine_would_choose_alone(model_dir) -> None:
    engine = load(model_dir())
    prompt = prompt_ids(40, seed=1)
    [opened] = engine.step(Step(opens=(Open(),))).opens
    [session] = opened.get()
    progress = prefill_all(engine, session, prompt, samplers=(greedy(),))
    alone = load(model_dir())
    other = alone.open_session()
    alone.append(other, prompt)
    assert progress.tokens == (alone.choose(other, greedy()),)
    assert session.length == len(prompt)


def test_every_first_token_of_a_step_comes_from_one_batched_choice(model_dir) -> None:
    engine = load(model_dir(), max_sessions=4)
    sessions = []
    for seed in range(4):
        session = engine.open_session()
        engine.append(session, prompt_ids(10 + seed, seed=seed))
        sessions.append(session)
    calls = []
    choose = engine.backend.choose

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(len(args[0]))
        return choose(*args, **kwargs)

    engine.backend.choose = counting  # type: ignore[method-assign]
    result = engine.step(Step(ops=tuple(Choose(s, greedy()) for s in sessions)))
    assert calls == [4] and result.choices == 1
    assert [o.get() for o in result.ops] == [engine.choose(s, greedy()) for s in sessions]


def test_n_copies_of_a_prefill_share_its_forwards_and_their_first_tokens(model_dir) -> None:
    engine = load(model_dir(), max_sessions=3)
    [opened] = engine.step(Step(opens=(Open(count=3),))).opens
    first, *copies = opened.get()
    progress = prefill_all(
        engine, first, prompt_ids(30, seed=4), samplers=(greedy(),) * 3, copies=tuple(copies)
    )
    assert len(set(progress.tokens)) == 1  # greedy on copies of the same logits
    assert all(c.length == first.length and c.tokens == first.tokens for c in copies)


def test_a_bad_item_fails_alone_and_the_rest_of_the_step_runs(model_dir) -> None:
    engine = load(model_dir(), max_sessions=3)
    good, empty = engine.open_session(), engine.open_session()
    engine.append(good, prompt_ids(12, seed=2))
    result = engine.step(
        Step(
            ops=(Rewind(good, 99), Choose(empty, greedy()), Stats(), Fork(good, 5)),
            decode=(DecodeRow(good, 5, greedy()), DecodeRow(good, 10**9, greedy())),
        )
    )
    rewind, choose, stats, fork = result.ops
    assert isinstance(rewind.error, InvalidInput) and "cannot keep 99 tokens" in str(rewind.error)
    assert isinstance(choose.error, OverCapacity)
    assert stats.get().sessions_open == 2
    assert fork.get().length == 5
    ran, bad = result.decode
    assert isinstance(ran.get(), int) and isinstance(bad.error, InvalidInput)
    assert good.length == 13


def test_a_close_frees_its_slot_for_an_open_in_the_same_step(model_dir) -> None:
    engine = load(model_dir(), max_sessions=1)
    session = engine.open_session()
    engine.append(session, prompt_ids(8, seed=5))
    result = engine.step(Step(ops=(Close(session),), opens=(Open(),)))
    assert result.ops[0].get() == 8
    assert len(result.opens[0].get()) == 1


def test_the_bookkeeping_invariants_are_checked_after_every_step(model_dir) -> None:
    engine = load(model_dir())
    session = engine.open_session()
    engine.append(session, prompt_ids(8, seed=6))
    engine.step(Step(ops=(Stats(),)))  # holds
    session.length += 1  # a write past the one writer (KvPool.commit): the mask no longer agrees
    with pytest.raises(EngineFault, match="mask 8, length 9"):
        engine.step(Step(ops=(Stats(),)))
