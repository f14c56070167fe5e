"""Fresh runs and the comparisons the exactness tests make (CPU int4 and CUDA fp16 alike)."""

from __future__ import annotations

import numpy as np

from engine.executor import DecodeRow, Engine, Session
from engine.executor.sampling import Sampler, SamplingParams

STEPS = 10


def decode(engine: Engine, session: Session, steps: int = STEPS) -> list[int]:
    """Greedy tokens from the session's logits, each fed back but the last."""
    sampler = Sampler(SamplingParams())
    out = [engine.choose(session, sampler)]
    while len(out) < steps:
        chosen = engine.decode([DecodeRow(session, out[-1], sampler)])[0]
        assert chosen is not None
        out.append(chosen)
    return out


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
