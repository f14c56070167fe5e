"""Choosing the next token from logits: greedy, temperature, top-k, top-p, repetition penalty.

Pure numpy and seeded: the same logits, history and seed always give the same
token. Greedy is temperature 0 (or top_k 1) and never touches the generator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Bounds on what a request may ask for. Beyond them the arithmetic stops meaning anything
# (a penalty of 1e-38 turns every seen logit into infinity) or nothing changes any more.
MAX_TEMPERATURE = 100.0
MAX_TOP_K = 1 << 20  # at or above the vocabulary, top-k keeps every token
REPETITION_PENALTY_RANGE = (1e-3, 1e3)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0  # 0 = no limit
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def validate(self) -> None:
        """Raise ValueError naming the first bad value (NaN and infinities included)."""
        if not 0.0 <= self.temperature <= MAX_TEMPERATURE:  # False for NaN
            raise ValueError(f"temperature must be in [0, {MAX_TEMPERATURE:g}], got {self.temperature}")
        if not 0 <= self.top_k <= MAX_TOP_K:
            raise ValueError(f"top_k must be in [0, {MAX_TOP_K}], got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        low, high = REPETITION_PENALTY_RANGE
        if not low <= self.repetition_penalty <= high:
            raise ValueError(f"repetition_penalty must be in [{low:g}, {high:g}], "
                             f"got {self.repetition_penalty}")
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise ValueError(f"seed must be in [0, 2^64), got {self.seed}")

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
    with np.errstate(over="ignore"):  # |logit| near float32's limit: infinity, which sampling handles
        out[seen] = np.where(values > 0, values / penalty, values * penalty)
    return out


def filtered_probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The distribution sampling draws from, after temperature, top-k and top-p.

    Always a distribution (finite, summing to 1): a NaN logit is never drawn, an
    infinite one wins, and a row with nothing finite falls back to its argmax.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = np.nan_to_num(logits.astype(np.float64) / params.temperature,
                               nan=-np.inf, posinf=np.finfo(np.float64).max, neginf=-np.inf)
    if 0 < params.top_k < scaled.size:
        kth = np.partition(scaled, -params.top_k)[-params.top_k]
        scaled = np.where(scaled >= kth, scaled, -np.inf)
    top = scaled.max()
    if top == -np.inf:
        return _one_hot(scaled.size, int(np.argmax(logits)))
    with np.errstate(over="ignore"):
        probs = np.exp(scaled - top)
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


def _one_hot(size: int, index: int) -> np.ndarray:
    probs = np.zeros(size, np.float64)
    probs[index] = 1.0
    return probs


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
