"""Exact on the numerics users serve: the default model in int4 (MatMulNBits, whose one-row kernel
differs from its multi-row one by up to 0.7 nats), through the engine.

Rewind, a shorter fork, a one-token extension, a prompt one row past a chunk and a repeated prompt
over its held prefix each continue as a fresh run of their tokens; in the deterministic mode their
next-token logits are bit-equal to a fresh run's, and a row's decode logits do not depend on how
many other sessions decode beside it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from engine.executor import DecodeRow
from engine.executor.engine import Engine
from engine.tokenizer import Tokenizer
from tests.support.engines import load_default
from tests.support.exactness import Fresh, check_fork_and_one_token_part, decode, same

PROMPTS = (
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at a temperature of",
    "My favourite book is",
    "In 1969, the first man to walk on the moon was",
    "The quick brown fox",
    "import numpy as np\n",
    "The best way to learn a language is",
)


def long_text(lines: int, thing: str = "prefill forward") -> str:
    return "".join(f"Line {i}: every {thing} runs on a ladder of three widths.\n" for i in range(lines))


@pytest.fixture(scope="module")
def model_dir(default_model: Callable[..., Path]) -> Path:
    return default_model("int4")


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Tokenizer:
    return Tokenizer(model_dir)


@pytest.fixture(scope="module", params=[False, True], ids=["default", "deterministic"])
def engine(request: pytest.FixtureRequest, model_dir: Path) -> Iterator[Engine]:
    engine = load_default(model_dir, max_sessions=4, capacity=2048, deterministic=request.param)
    yield engine
    engine.close()


@pytest.mark.parametrize("text", PROMPTS)
def test_a_rewind_to_the_prompt_then_decode_repeats_the_first_decode(
    engine: Engine, tokenizer: Tokenizer, text: str
) -> None:
    ids = tokenizer.encode(text)
    session = engine.open_session()
    try:
        engine.append(session, ids)
        first = decode(engine, session)
        engine.decode([DecodeRow(session, first[-1])])
        engine.rewind(session, len(ids))
        assert decode(engine, session) == first
    finally:
        engine.close_session(session, keep=False)


@pytest.mark.parametrize("text", PROMPTS)
def test_a_shorter_fork_and_a_one_token_part_continue_as_a_fresh_run(
    engine: Engine, tokenizer: Tokenizer, text: str
) -> None:
    ids = tokenizer.encode(text)
    fresh = Fresh(engine, ids)
    source = engine.open_session()
    try:
        engine.append(source, ids + tokenizer.encode(" and then some more words"))
        check_fork_and_one_token_part(engine, source, ids, fresh)
    finally:
        engine.close_session(source, keep=False)


@pytest.mark.parametrize("text", PROMPTS)
def test_a_first_part_of_one_token_then_the_rest_continues_as_a_fresh_run(
    engine: Engine, tokenizer: Tokenizer, text: str
) -> None:
    """A client streaming its prompt token by token: the first row, run alone, is run again with
    what follows it (issue #46: it was kept, and every later row followed it)."""
    ids = tokenizer.encode(text)
    fresh = Fresh(engine, ids)
    session = engine.open_session()
    try:
        engine.append(session, ids[:1])
        engine.append(session, ids[1:])
        same(engine, session, fresh)
    finally:
        engine.close_session(session, keep=False)


def test_a_rewind_into_a_decoded_reply_continues_as_a_fresh_run_of_the_tokens_kept(
    engine: Engine, tokenizer: Tokenizer
) -> None:
    ids = tokenizer.encode(PROMPTS[0])
    session = engine.open_session()
    try:
        engine.append(session, ids)
        reply = decode(engine, session, 20)
        engine.decode([DecodeRow(session, reply[-1])])
        engine.rewind(session, len(ids) + 12)
        same(engine, session, Fresh(engine, ids + reply[:12]))
    finally:
        engine.close_session(session, keep=False)


@pytest.mark.parametrize("length", [513, 1025])
def test_a_prompt_one_row_past_a_chunk_continues_as_it_does_in_parts(
    engine: Engine, tokenizer: Tokenizer, length: int
) -> None:
    ids = tokenizer.encode(long_text(90))[:length]
    fresh = Fresh(engine, ids)
    session = engine.open_session()
    try:
        engine.append(session, ids[:300])
        engine.append(session, ids[300:-1])
        engine.append(session, ids[-1:])
        same(engine, session, fresh)
    finally:
        engine.close_session(session, keep=False)


def test_a_repeated_prompt_over_its_held_prefix_gives_the_same_tokens(
    engine: Engine, tokenizer: Tokenizer
) -> None:
    ids = tokenizer.encode(long_text(90))[:1025]
    fresh = Fresh(engine, ids)
    for _ in range(2):  # the first call leaves the prefix held; the second shares it
        session = engine.open_session(prompt=ids)
        try:
            engine.append(session, ids[session.length :])
            same(engine, session, fresh)
            reply = decode(engine, session, 4)
            engine.decode([DecodeRow(session, reply[-1])])  # rows a decode step wrote, then held
        finally:
            engine.close_session(session)
    assert engine.prefixes.counts["hits"] >= 1


def test_a_prefix_is_shared_only_as_far_as_a_fresh_run_wrote_it(engine: Engine, tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode(long_text(30, "decode step"))  # a prefix no other test leaves held
    holder = engine.open_session()
    try:
        engine.append(holder, ids)
        reply = decode(engine, holder, 8)
        engine.decode([DecodeRow(holder, reply[-1])])
        prompt = ids + reply + tokenizer.encode(" Line 99:")
        fresh = Fresh(engine, prompt)
        session = engine.open_session(prompt=prompt)
        assert session.length <= len(ids)
        engine.append(session, prompt[session.length :])
        same(engine, session, fresh)
        engine.close_session(session, keep=False)
    finally:
        engine.close_session(holder, keep=False)


def test_deterministic_decode_logits_do_not_depend_on_the_rows_beside_them(
    engine: Engine, tokenizer: Tokenizer
) -> None:
    if not engine.options.deterministic:
        pytest.skip("the default mode's decode width follows the load")
    ids = tokenizer.encode(PROMPTS[1])
    alone = engine.open_session()
    engine.append(alone, ids)
    engine.decode([DecodeRow(alone, ids[-1] + 1)])
    expected = engine.logits(alone)
    engine.close_session(alone, keep=False)
    sessions = [engine.open_session() for _ in range(3)]
    try:
        for i, s in enumerate(sessions):
            engine.append(s, tokenizer.encode(PROMPTS[i + 2]) if i else ids)
        engine.decode([DecodeRow(s, ids[-1] + 1) for s in sessions])
        np.testing.assert_array_equal(engine.logits(sessions[0]), expected)
    finally:
        for s in sessions:
            engine.close_session(s, keep=False)
