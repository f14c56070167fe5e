"""Verification forwards (issue #44) on the generated decoder: a drafted decode row keeps its
draft for exactly as long as greedy decoding would have produced it, the rows past what it keeps
are rewound, acceptance ends at a stop id and at the KV capacity, a drafted row beside others
decodes plainly, and verification shapes stay on their ladder.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engine.executor import DecodeRow, Session
from engine.executor.engine import Engine
from engine.executor.step import Verified
from engine.planner.drafts import VERIFY_WIDTHS
from engine.sampling import Sampler, SamplingParams
from tests.support.engines import load
from tests.support.prompts import prompt_ids

PROMPT = prompt_ids(40, seed=3)


@pytest.fixture(scope="module")
def engine(model_dir: Callable[..., Path]) -> Iterator[Engine]:
    engine = load(model_dir("plain"), max_sessions=4, capacity=128, speculate=True)
    yield engine
    engine.close()


def greedy() -> Sampler:
    return Sampler(SamplingParams())


def opened(engine: Engine, prompt: list[int] = PROMPT) -> tuple[Session, Sampler, int]:
    """A session holding `prompt`, a greedy sampler and the first token chosen from its logits."""
    session = engine.open_session()
    engine.append(session, prompt)
    sampler = greedy()
    return session, sampler, engine.choose(session, sampler)


def plain_tokens(engine: Engine, steps: int, prompt: list[int] = PROMPT) -> list[int]:
    """The first token and `steps` more, one decode step each."""
    session, sampler, token = opened(engine, prompt)
    out = [token]
    for _ in range(steps):
        out.append(engine.decode([DecodeRow(session, out[-1], sampler)])[0])  # type: ignore[arg-type]
    engine.close_session(session, keep=False)
    return out


def verify(
    engine: Engine, session: Session, sampler: Sampler, token: int, drafts: list[int], **kw: object
) -> Verified:
    result = engine.decode([DecodeRow(session, token, sampler, drafts=tuple(drafts), **kw)])[0]  # type: ignore[arg-type]
    assert isinstance(result, Verified)
    return result


def test_the_machine_computes_verification_rows_as_decode_rows(engine: Engine) -> None:
    assert engine.kernels.speculation_exact, engine.kernels


def test_a_draft_greedy_would_write_is_kept_whole_with_one_token_more(engine: Engine) -> None:
    want = plain_tokens(engine, 12)
    session, sampler, token = opened(engine)
    got = verify(engine, session, sampler, token, want[1:5])
    assert got.tokens == tuple(want[1:6]) and got.drafted == 4 and got.accepted == 4
    assert session.length == len(PROMPT) + 5 and session.tokens == PROMPT + want[:5]
    rest = [got.tokens[-1]]
    for _ in range(6):  # decoding on from there continues the plain run
        rest.append(engine.decode([DecodeRow(session, rest[-1], sampler)])[0])  # type: ignore[arg-type]
    assert rest == want[5:12]
    engine.close_session(session, keep=False)


def test_a_draft_is_kept_up_to_its_first_wrong_token_and_the_rows_past_it_rewound(engine: Engine) -> None:
    want = plain_tokens(engine, 12)
    wrong = (want[3] + 1) % engine.info.vocab_size
    session, sampler, token = opened(engine)
    got = verify(engine, session, sampler, token, [want[1], want[2], wrong, want[4]])
    assert got.tokens == tuple(want[1:4]) and got.accepted == 2
    assert session.length == len(PROMPT) + 3
    rest = [got.tokens[-1]]
    for _ in range(8):
        rest.append(engine.decode([DecodeRow(session, rest[-1], sampler)])[0])  # type: ignore[arg-type]
    assert rest == want[3:12]
    engine.close_session(session, keep=False)


def test_acceptance_ends_after_a_stop_id(engine: Engine) -> None:
    want = plain_tokens(engine, 8)
    session, sampler, token = opened(engine)
    got = verify(engine, session, sampler, token, want[1:6], stops=frozenset({want[2]}))
    assert got.tokens == tuple(want[1:3])
    assert session.tokens == PROMPT + want[:2]
    engine.close_session(session, keep=False)


def test_a_draft_never_takes_the_session_past_its_kv_capacity(engine: Engine) -> None:
    prompt = prompt_ids(engine.capacity - 3, seed=5)
    want = plain_tokens(engine, 3, prompt)
    session, sampler, token = opened(engine, prompt)
    got = verify(engine, session, sampler, token, want[1:4] + [1, 2, 3])
    assert got.drafted == 2 and got.tokens == tuple(want[1:4])
    assert session.length == engine.capacity
    engine.close_session(session, keep=False)


def test_a_drafted_row_beside_other_rows_decodes_as_a_plain_row(engine: Engine) -> None:
    want = plain_tokens(engine, 4)
    session, sampler, token = opened(engine)
    other, other_sampler, other_token = opened(engine, prompt_ids(20, seed=9))
    got, _ = engine.decode(
        [
            DecodeRow(session, token, sampler, drafts=tuple(want[1:4])),
            DecodeRow(other, other_token, other_sampler),
        ]
    )
    assert got == Verified((want[1],), (None,), 0)
    assert session.length == len(PROMPT) + 1
    for s in (session, other):
        engine.close_session(s, keep=False)


def test_verification_forwards_run_on_their_ladder_and_a_second_pass_prepares_nothing(engine: Engine) -> None:
    want = plain_tokens(engine, 10)

    def every_length() -> None:
        for k in range(1, 9):
            session, sampler, token = opened(engine)
            verify(engine, session, sampler, token, want[1 : 1 + k])
            engine.close_session(session, keep=False)

    every_length()
    prepared = engine.variants.stats().prepared
    widths = {e.key.width for e in engine.variants.stats().entries if e.key.reads > 1 and not e.key.prompts}
    assert widths <= set(VERIFY_WIDTHS)
    every_length()
    assert engine.variants.stats().prepared == prepared


def test_verifications_are_counted(engine: Engine) -> None:
    before = engine.stats().decode
    want = plain_tokens(engine, 6)
    session, sampler, token = opened(engine)
    verify(engine, session, sampler, token, [want[1], (want[2] + 1) % engine.info.vocab_size])
    engine.close_session(session, keep=False)
    after = engine.stats().decode
    assert (after.verify_forwards - before.verify_forwards, after.drafted - before.drafted) == (1, 2)
    assert after.accepted - before.accepted == 1


def test_without_speculation_a_drafted_row_decodes_plainly_and_no_shape_is_reserved(
    model_dir: Callable[..., Path],
) -> None:
    engine = load(model_dir("plain"), max_sessions=4, capacity=128)
    assert engine.kernels.verify_gap is None
    assert engine.variants.capacity == len(engine.ladder) + len(engine.batch_widths)
    want = plain_tokens(engine, 3)
    session, sampler, token = opened(engine)
    assert verify(engine, session, sampler, token, want[1:3]) == Verified((want[1],), (None,), 0)
    engine.close()


@pytest.mark.parametrize("seed", range(12))
def test_a_seeded_sample_draws_the_same_tokens_whatever_the_drafts(engine: Engine, seed: int) -> None:
    """Each position's draw is keyed by the seed and the position: verifying a draft draws the
    numbers a plain step draws, so the sample (and its distribution) is the plain run's, whether
    the drafts are right (the plain run's own tokens) or wrong."""
    params = SamplingParams(temperature=1.0, seed=seed)

    def run(drafts_for: Callable[[list[int]], list[int]]) -> list[int]:
        session = engine.open_session()
        engine.append(session, PROMPT)
        sampler = Sampler(params)
        out = [engine.choose(session, sampler)]
        while len(out) < 16:
            got = engine.decode([DecodeRow(session, out[-1], sampler, drafts=tuple(drafts_for(out)))])[0]
            out += list(got.tokens) if isinstance(got, Verified) else [got]  # type: ignore[list-item]
        engine.close_session(session, keep=False)
        return out[:16]

    plain = run(lambda out: [])
    assert run(lambda out: plain[len(out) : len(out) + 4]) == plain  # right drafts, all kept
    assert (
        run(lambda out: [(t + 1) % engine.info.vocab_size for t in plain[len(out) : len(out) + 4]]) == plain
    )
