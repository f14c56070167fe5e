"""Idle sessions another caller holds never change an answer (issue #46), in the default mode on
the default model in int4, whose MatMulNBits rounds differently at each decode batch width.

A decode forward's width follows how many sessions decode in it: a session above that width
moves to a lower row first (`Engine.compact`), so a request decodes as it does on an idle
engine whichever rows others hold. Each answer here is compared with the same request on an
idle engine: greedy tokens equal and every step's next-token logits bit-equal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from engine.chat_messages import ChatMessage
from engine.executor import DecodeRow, Session
from engine.executor.engine import Engine
from engine.sampling import Sampler, SamplingParams
from engine.tokenizer import Tokenizer
from tests.support.engines import load_default

QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "How do I reverse a list in Python?",
    "Name three primary colors.",
    "Why is the sky blue?",
    "Give me a synonym for happy.",
    "What is 17 times 3?",
    "Tell me a fun fact about owls.",
    "Translate 'good morning' into Spanish.",
    "What does a CPU do?",
)
STEPS = 12
OTHER = "another-caller"
GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def model_dir(default_model: Callable[..., Path]) -> Path:
    return default_model("int4")


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Tokenizer:
    return Tokenizer(model_dir)


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Iterator[Engine]:
    engine = load_default(model_dir, max_sessions=8, capacity=1024)
    yield engine
    engine.close()


def chat(tokenizer: Tokenizer, question: str) -> list[int]:
    return tokenizer.encode(tokenizer.render_chat([ChatMessage("user", question)]))


class Answer:
    """Tokens chosen by `sampler` from a session's logits, fed back one decode step each, and the
    next-token logits before every choice (host copies)."""

    def __init__(
        self, engine: Engine, session: Session, params: SamplingParams = GREEDY, steps: int = STEPS
    ) -> None:
        sampler = Sampler(params)
        self.logits = [engine.logits(session)]
        self.tokens = [engine.choose(session, sampler)]
        while len(self.tokens) < steps:
            chosen = engine.decode([DecodeRow(session, self.tokens[-1], sampler)])[0]
            assert chosen is not None
            self.tokens.append(chosen)
            self.logits.append(engine.logits(session))

    def equals(self, other: Answer) -> None:
        assert self.tokens == other.tokens
        for mine, theirs in zip(self.logits, other.logits, strict=True):
            np.testing.assert_array_equal(mine, theirs)


def alone(engine: Engine, ids: list[int], params: SamplingParams = GREEDY) -> Answer:
    """The answer on an idle engine: a session of its own, nothing else open."""
    assert engine.sessions_open == 0
    session = engine.open_session()
    try:
        engine.append(session, ids)
        return Answer(engine, session, params)
    finally:
        engine.close_session(session, keep=False)


class Held:
    """`count` idle sessions of another caller, each holding a prompt of its own."""

    def __init__(self, engine: Engine, tokenizer: Tokenizer, count: int) -> None:
        self.engine = engine
        self.sessions = [engine.open_session(OTHER) for _ in range(count)]
        for i, session in enumerate(self.sessions):
            engine.append(session, chat(tokenizer, f"Count to {i + 3}."))

    def __enter__(self) -> Held:
        return self

    def __exit__(self, *_: object) -> None:
        for session in self.sessions:
            self.engine.close_session(session, keep=False)


@contextmanager
def narrowest(engine: Engine, narrow: bool) -> Iterator[None]:
    """With `narrow`, decode forwards as narrow as one row, whatever this CPU's rules (where one
    row rounds differently from two, as on an AVX2-only CPU, every width then differs)."""
    rules = engine.kernels
    if narrow:
        engine.follow(replace(rules, least_decode_batch=1))
    try:
        yield
    finally:
        engine.follow(rules)


@pytest.fixture(scope="module")
def references(engine: Engine, tokenizer: Tokenizer) -> dict[bool, list[Answer]]:
    """Each question's answer on the idle engine, with decode forwards as measured and as narrow
    as one row."""
    answers = {}
    for narrow in (False, True):
        with narrowest(engine, narrow):
            answers[narrow] = [alone(engine, chat(tokenizer, q)) for q in QUESTIONS]
    return answers


@pytest.mark.parametrize("narrow", [False, True], ids=["as-measured", "one-row-forwards"])
@pytest.mark.parametrize("held", [1, 3, 7])
def test_a_greedy_chat_answer_is_bit_equal_while_another_caller_holds_idle_sessions(
    engine: Engine, tokenizer: Tokenizer, references: dict[bool, list[Answer]], held: int, narrow: bool
) -> None:
    with narrowest(engine, narrow), Held(engine, tokenizer, held):
        for question, reference in zip(QUESTIONS, references[narrow], strict=True):
            session = engine.open_session()
            try:
                engine.append(session, chat(tokenizer, question))
                Answer(engine, session).equals(reference)
            finally:
                engine.close_session(session, keep=False)


def test_a_session_above_the_width_of_its_forward_moves_down_and_the_idle_one_keeps_its_answer(
    engine: Engine, tokenizer: Tokenizer
) -> None:
    """The moved session and the idle one whose row it took both continue as they would have."""
    second = chat(tokenizer, QUESTIONS[1])
    expected = alone(engine, second)
    expected_idle = [alone(engine, chat(tokenizer, f"Count to {i + 3}.")) for i in range(7)]
    with Held(engine, tokenizer, 7) as held:
        rows = [s.row for s in held.sessions]
        moved = engine.stats().decode.rows_moved
        session = engine.open_session()
        try:
            engine.append(session, second)
            Answer(engine, session).equals(expected)
            assert engine.stats().decode.rows_moved > moved and session.row < engine.decoder.width(1)
        finally:
            engine.close_session(session, keep=False)
        engine.check_invariants()
        swapped = [i for i, s in enumerate(held.sessions) if s.row != rows[i]]
        assert len(swapped) == 1  # the idle session whose row the new one took, on the new one's row
        Answer(engine, held.sessions[swapped[0]]).equals(expected_idle[swapped[0]])


def test_a_fork_decodes_as_its_source_would_alone_while_the_source_idles(
    engine: Engine, tokenizer: Tokenizer
) -> None:
    prompts = [chat(tokenizer, question) for question in QUESTIONS[:5]]
    expected = [alone(engine, ids) for ids in prompts]
    with Held(engine, tokenizer, 3):
        for ids, reference in zip(prompts, expected, strict=True):
            source = engine.open_session()
            engine.append(source, ids)
            fork = engine.fork(source)
            try:
                Answer(engine, fork).equals(reference)
            finally:
                engine.close_session(fork, keep=False)
                engine.close_session(source, keep=False)


def test_a_prompt_over_a_prefix_an_idle_session_holds_gives_the_idle_engine_s_tokens(
    engine: Engine, tokenizer: Tokenizer
) -> None:
    """A new session of the same caller starts from the prefix its other, idle session holds."""
    system = ChatMessage("system", "You are a careful assistant. " * 40)  # whole prefix units
    first = tokenizer.encode(tokenizer.render_chat([system, ChatMessage("user", "Say hello.")]))
    prompts = [
        tokenizer.encode(tokenizer.render_chat([system, ChatMessage("user", question)]))
        for question in QUESTIONS[:3]
    ]
    expected = [alone(engine, ids).tokens for ids in prompts]
    with Held(engine, tokenizer, 3):
        holder = engine.open_session("mine")
        engine.append(holder, first)
        try:
            for ids, tokens in zip(prompts, expected, strict=True):
                session = engine.open_session("mine", prompt=ids)
                try:
                    assert session.length > 0  # it started from the held prefix
                    engine.append(session, ids[session.length :])
                    assert Answer(engine, session).tokens == tokens
                finally:
                    engine.close_session(session, keep=False)
        finally:
            engine.close_session(holder, keep=False)


def test_sample_i_of_n_is_the_one_sample_request_with_seed_plus_i_while_others_idle(
    engine: Engine, tokenizer: Tokenizer
) -> None:
    """n samples of one prefill decode together; each equals the request alone with its seed."""
    ids = chat(tokenizer, QUESTIONS[7])
    params = [SamplingParams(temperature=0.8, top_p=0.95, seed=1234 + i) for i in range(3)]
    expected = [alone(engine, ids, p).tokens for p in params]
    with Held(engine, tokenizer, 3):
        rows = [engine.open_session() for _ in params]
        try:
            engine.append(rows[0], ids)
            for target in rows[1:]:
                engine.copy_session(rows[0], target)
            samplers = [Sampler(p) for p in params]
            tokens = [[engine.choose(s, sampler)] for s, sampler in zip(rows, samplers, strict=True)]
            while len(tokens[0]) < STEPS:
                step = engine.decode(
                    [
                        DecodeRow(s, t[-1], sampler)
                        for s, t, sampler in zip(rows, tokens, samplers, strict=True)
                    ]
                )
                for t, chosen in zip(tokens, step, strict=True):
                    assert chosen is not None
                    t.append(chosen)
            assert tokens == expected
        finally:
            for session in rows:
                engine.close_session(session, keep=False)
