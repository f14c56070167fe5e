"""Judging draws by their distribution: chi-squared against the exact filtered distribution, and
nothing ever drawn outside it (engine.sampling on the host, engine.runtime.sampled on the device)."""

from __future__ import annotations

import itertools
import math

import numpy as np

from engine.sampling import SamplingParams


def chi_squared_limit(degrees: int, z: float = 4.75) -> float:
    """The chi-squared value a correct sampler exceeds with probability ~1e-6 (Wilson-Hilferty)."""
    k = max(degrees, 1)
    return float(k * (1 - 2 / (9 * k) + z * math.sqrt(2 / (9 * k))) ** 3)


def assert_drawn_from(counts: np.ndarray, expected: np.ndarray) -> None:
    """No draw outside the distribution's support, and chi-squared within a 1e-6 tail inside it."""
    outside = counts[expected == 0]
    assert outside.sum() == 0, f"drawn outside the kept: {np.flatnonzero((expected == 0) & (counts > 0))}"
    support = expected > 0
    want = expected[support] * counts.sum()
    stat = float(((counts[support] - want) ** 2 / want).sum())
    assert stat < chi_squared_limit(int(support.sum()) - 1), (stat, counts[support], want)


# Every combination of temperature, top-k, top-p and min-p the statistical tests draw with.
COMBINATIONS = [
    SamplingParams(temperature=t, top_k=k, top_p=p, min_p=m, seed=1)
    for t, k, p, m in itertools.product((0.5, 1.0, 1.7), (0, 7), (1.0, 0.7), (0.0, 0.05))
]


def named(p: SamplingParams) -> str:
    return f"t{p.temperature}-k{p.top_k}-p{p.top_p}-m{p.min_p}"


def row_logits(seed: int, vocab: int = 40) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(vocab) * 2).astype(np.float32)
