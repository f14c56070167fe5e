"""Small factories the engine tests share."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.executor import Engine, EngineOptions, Session


def load(path: Path, **options: object) -> Engine:
    return Engine.load(path, EngineOptions(**options))  # type: ignore[arg-type]


def prompt(length: int, seed: int = 0, vocab: int = 512) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, vocab, length)]


def greedy(session: Session, logits: np.ndarray, steps: int) -> list[int]:
    """Continue greedily for `steps` tokens from `logits`."""
    out = []
    for _ in range(steps):
        token = int(np.argmax(logits))
        out.append(token)
        logits = session.append([token])
    return out


def greedy_from_prompt(engine: Engine, tokens: list[int], steps: int) -> list[int]:
    """Greedy continuation of `tokens` on a session of its own, returned to the pool after."""
    session = engine.open_session()
    try:
        return greedy(session, session.append(tokens), steps)
    finally:
        session.close()
