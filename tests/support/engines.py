"""Engines on generated models, and the greedy references the tests compare servers and paths against."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from engine.executor import DecodeRow, Engine, EngineOptions, Session
from engine.executor.sampling import Sampler, SamplingParams


def load(path: Path, **options: object) -> Engine:
    return Engine.load(path, EngineOptions(**options))  # type: ignore[arg-type]


def greedy(engine: Engine, session: Session, steps: int, tokens: Sequence[int] | None = None) -> list[int]:
    """Append `tokens` (if given), then continue greedily for `steps` tokens, one decode step each.

    Every chosen token is fed back, the last one included, so the session ends
    holding all of them (a next turn appends after the whole continuation).
    """
    if tokens is not None:
        engine.append(session, tokens)
    sampler = Sampler(SamplingParams())
    out = [engine.choose(session, sampler)]
    while len(out) < steps:
        chosen = engine.decode([DecodeRow(session, out[-1], sampler)])[0]
        assert chosen is not None
        out.append(chosen)
    engine.decode([DecodeRow(session, out[-1])])
    return out


def greedy_from_prompt(engine: Engine, tokens: list[int], steps: int) -> list[int]:
    """Greedy continuation of `tokens` on a session of its own, returned to the pool after."""
    session = engine.open_session()
    try:
        return greedy(engine, session, steps, tokens)
    finally:
        engine.close_session(session)


def greedy_by_appending(engine: Engine, tokens: list[int], steps: int) -> list[int]:
    """The argmax continuation computed the plainest way: each token appended as a whole forward
    (no decode step, no sampler), on a session of its own."""
    session = engine.open_session()
    try:
        logits, out = engine.append(session, tokens), []
        for _ in range(steps):
            out.append(int(np.argmax(logits)))
            logits = engine.append(session, [out[-1]])
        return out
    finally:
        engine.close_session(session)
