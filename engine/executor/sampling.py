"""Choosing the next token from logits: greedy, temperature, top-k, top-p, repetition penalty.

Pure numpy and seeded: the same logits, history and seed always give the same
token. Greedy is temperature 0 (or top_k 1) and never touches the generator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0  # 0 = no limit
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def validate(self) -> None:
        """Raise ValueError naming the first bad value."""
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not np.isfinite(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


def apply_repetition_penalty(logits: np.ndarray, history: Sequence[int],
                             penalty: float) -> np.ndarray:
    """Divide positive logits of seen tokens by the penalty, multiply negative ones (CTRL)."""
    if penalty == 1.0 or not history:
        return logits
    out = logits.astype(np.float32, copy=True)
    seen = np.unique(np.asarray(history, dtype=np.int64))
    values = out[seen]
    out[seen] = np.where(values > 0, values / penalty, values * penalty)
    return out


def filtered_probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The distribution sampling draws from, after temperature, top-k and top-p."""
    scaled = logits.astype(np.float64) / params.temperature
    if 0 < params.top_k < scaled.size:
        kth = np.partition(scaled, -params.top_k)[-params.top_k]
        scaled = np.where(scaled >= kth, scaled, -np.inf)
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        keep = order[: int(np.searchsorted(cumulative, params.top_p)) + 1]
        mask = np.zeros_like(probs)
        mask[keep] = probs[keep]
        probs = mask / mask.sum()
    return np.asarray(probs, np.float64)


class Sampler:
    def __init__(self, params: SamplingParams) -> None:
        params.validate()
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        logits = apply_repetition_penalty(logits, history, self.params.repetition_penalty)
        if self.params.greedy:
            return int(np.argmax(logits))
        probs = filtered_probabilities(logits, self.params)
        return int(self.rng.choice(probs.size, p=probs))
