"""Fresh runs and the comparisons the exactness tests make (CPU int4 and CUDA fp16 alike)."""

from __future__ import annotations

import numpy as np

from engine.executor import Session
from engine.executor.engine import Engine
from tests.support.engines import greedy

STEPS = 10


def decode(engine: Engine, session: Session, steps: int = STEPS) -> list[int]:
    """Greedy tokens from the session's logits, each fed back but the last."""
    return greedy(engine, session, steps, feed_last=False)


class Fresh:
    """A fresh run of a prompt on a session of its own: its next-token logits and greedy tokens."""

    def __init__(self, engine: Engine, ids: list[int]) -> None:
        session = engine.open_session()
        try:
            self.logits = engine.append(session, ids)
            self.tokens = decode(engine, session)
        finally:
            engine.close_session(session, keep=False)


def same(engine: Engine, session: Session, fresh: Fresh) -> None:
    """The session continues as the fresh run; in the deterministic mode bit for bit."""
    if engine.options.deterministic:
        np.testing.assert_array_equal(engine.logits(session), fresh.logits)
    assert decode(engine, session) == fresh.tokens


def check_fork_and_one_token_part(engine: Engine, source: Session, ids: list[int], fresh: Fresh) -> None:
    """A fork of `source` at `ids`' length, and `ids` sent as all but one token then the last one,
    each continue as the fresh run of `ids`."""
    fork = engine.fork(source, len(ids))
    try:
        same(engine, fork, fresh)
    finally:  # a failed check fails this test alone, not every test after it on the engine
        engine.close_session(fork, keep=False)
    parts = engine.open_session()
    try:
        engine.append(parts, ids[:-1])
        engine.append(parts, ids[-1:])
        same(engine, parts, fresh)
    finally:
        engine.close_session(parts, keep=False)
