"""Choosing the next token from logits: greedy, temperature, top-k, top-p, min-p and penalties.

Pure numpy and seeded: the same logits, history and seed always give the same
token. Greedy is temperature 0 (or top_k 1) and draws nothing.

Draws are counter-based (`uniform`): Philox4x64-10 keyed by the request's seed (or a random key
when it has none) with the token's position in the sequence as the counter, so a draw depends on
nothing but (seed, sample, position) and the row's logits: not on which rows share a step, how many
there are, or what was drawn before. The CUDA backend computes the same uniform on the device
(engine/runtime/sampled.py).

Order, as in vLLM: penalties (repetition over the whole sequence, presence and
frequency over the tokens this sampler chose), then temperature, then top-k,
min-p and top-p. Log-probabilities (`log_probs`) are of the raw logits, before
any of these: the distribution the model gave.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

# Bounds on what a request may ask for. Beyond them the arithmetic stops meaning anything
# (a penalty of 1e-38 turns every seen logit into infinity) or nothing changes any more.
MAX_TEMPERATURE = 100.0
MAX_TOP_K = 1 << 20  # at or above the vocabulary, top-k keeps every token
REPETITION_PENALTY_RANGE = (1e-3, 1e3)
PRESENCE_FREQUENCY_RANGE = (-2.0, 2.0)  # the OpenAI API's range
MAX_TOP_LOGPROBS = 20  # alternatives per token: each crosses to the host and into every response


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0  # 0 = no limit
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    min_p: float = 0.0  # keep tokens at least min_p times as likely as the most likely; 0 = off
    presence_penalty: float = 0.0  # subtracted once from each token this sampler has chosen
    frequency_penalty: float = 0.0  # subtracted per time this sampler has chosen the token

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
            raise ValueError(
                f"repetition_penalty must be in [{low:g}, {high:g}], got {self.repetition_penalty}"
            )
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise ValueError(f"seed must be in [0, 2^64), got {self.seed}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        low, high = PRESENCE_FREQUENCY_RANGE
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not low <= value <= high:
                raise ValueError(f"{name} must be in [{low:g}, {high:g}], got {value}")

    @property
    def penalized(self) -> bool:
        """Whether any penalty changes the logits before choosing."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def for_sample(self, index: int) -> SamplingParams:
        """The parameters of sample `index` of a request: seed, seed + 1, ... (mod 2^64)."""
        return self if self.seed is None or index == 0 else replace(self, seed=(self.seed + index) % 2**64)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


def apply_repetition_penalty(logits: Any, history: Sequence[int], penalty: float, xp: Any = np) -> Any:
    """Divide positive logits of seen tokens by the penalty, multiply negative ones (CTRL).

    One formula wherever the logits live: `xp` is numpy on the host, cupy on the device."""
    if penalty == 1.0 or not history:
        return logits
    out = logits.astype(xp.float32, copy=True)
    seen = xp.asarray(np.unique(np.asarray(history, dtype=np.int64)))
    values = out[seen]
    with np.errstate(over="ignore"):  # |logit| near float32's limit: infinity, which sampling handles
        out[seen] = xp.where(values > 0, values / penalty, values * penalty)
    return out


def apply_presence_frequency(
    logits: Any, counts: Counter[int], presence: float, frequency: float, xp: Any = np
) -> Any:
    """OpenAI's penalties: logit[j] -= count[j] * frequency + (count[j] > 0) * presence.

    Only the chosen tokens' ids and counts move to where the logits live (`xp`, as above)."""
    if not counts or (presence == 0.0 and frequency == 0.0):
        return logits
    out = logits.astype(xp.float32, copy=True)
    ids, times = counted(counts)
    out[xp.asarray(ids)] -= xp.asarray(times) * np.float32(frequency) + np.float32(presence)
    return out


def counted(counts: Counter[int]) -> tuple[np.ndarray, np.ndarray]:
    """The chosen tokens and how often each was chosen, as arrays (ids int64, times float32)."""
    ids = np.fromiter(counts.keys(), np.int64, len(counts))
    return ids, np.fromiter(counts.values(), np.float32, len(counts))


def filtered_probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The distribution sampling draws from, after temperature, top-k and top-p.

    Always a distribution (finite, summing to 1): a NaN logit is never drawn, an
    infinite one wins, and a row with nothing finite falls back to its argmax.
    """
    # In place after the first float64 copy: each fresh 128k-row temporary costs an allocation and
    # its page faults (the values are those of the same operations on new arrays).
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = logits.astype(np.float64)
        scaled /= params.temperature
        if not np.isfinite(scaled).all():  # ~0.015 ms; the replacement costs ~0.14 ms on 49k
            np.nan_to_num(scaled, copy=False, nan=-np.inf, posinf=np.finfo(np.float64).max, neginf=-np.inf)
    if 0 < params.top_k < scaled.size:
        kth = np.partition(scaled, -params.top_k)[-params.top_k]
        scaled = np.where(scaled >= kth, scaled, -np.inf)
    top = scaled.max()
    if top == -np.inf:
        return _one_hot(scaled.size, int(np.argmax(logits)))
    probs = scaled
    probs -= top
    with np.errstate(over="ignore"):
        np.exp(probs, out=probs)
    probs /= probs.sum()
    if params.min_p > 0.0:
        # Relative to the most likely token, after temperature (vLLM's and llama.cpp's order).
        probs = np.where(probs >= params.min_p * probs.max(), probs, 0.0)
        probs /= probs.sum()
    if params.top_p < 1.0:
        probs = np.where(nucleus_mask(probs, params.top_p), probs, 0.0)
        probs /= probs.sum()
    return np.asarray(probs, np.float64)


NUCLEUS_HEAD = 512  # top-p sorts this many of the largest values first, then 8x more, ...


_SCRATCH = threading.local()


def _scratch(size: int) -> tuple[np.ndarray, np.ndarray]:
    """Two float64 buffers of `size` for this thread, kept between draws: a fresh 49k-value
    temporary costs its page faults each time (the sort and running sums of a flat row's top-p
    took ~1.7 ms in fresh arrays, ~0.9 ms in these)."""
    buffers: tuple[np.ndarray, np.ndarray] | None = getattr(_SCRATCH, "buffers", None)
    if buffers is None or buffers[0].size < size:
        buffers = _SCRATCH.buffers = (np.empty(size, np.float64), np.empty(size, np.float64))
    return buffers[0][:size], buffers[1][:size]


def nucleus(probs: np.ndarray, top_p: float) -> np.ndarray:
    """The tokens top-p keeps: the shortest prefix of the tokens by falling probability (ties: the
    lower id first) whose mass reaches `top_p`, always at least one, in that order."""
    ids = np.flatnonzero(nucleus_mask(probs, top_p))  # ascending: ties keep the lower id first below
    return ids[np.argsort(-probs[ids], kind="stable")]


def nucleus_mask(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Which tokens top-p keeps (`nucleus`'s tokens, as a mask: a flat row keeps tens of thousands,
    and neither their order nor their indices are needed to filter).

    The same tokens, and the same sums on the way, as sorting every token, at a fraction of the
    cost (a stable argsort of a 49k vocabulary took ~6 ms a row, a 128k one ~10 ms). The cut comes
    from the values alone: the running sums depend only on the sequence of values by falling
    probability, which is the same for every order that ties may take, so the cut is the full
    sort's; the kept tokens are those above the cut's value and, of those equal to it, the lowest
    ids. Only a head of the largest values is sorted: 512 first, then, while its sums stop short of
    `top_p`, a head grown by three times the fewest values that could make up the rest (each is at
    most the head's smallest) and at least doubled (a partition picks a head, ~0.1 ms on 49k; a
    running sum is sequential, so a head's sums are the full order's first sums), every value once
    the head would be half the row. The default model's rows keep ~2k tokens at top_p 0.95 (10 %
    keep over 10k): 0.75 -> 0.37 ms a row against growing 8x.
    A head whose largest possible mass (its size times the largest probability) cannot reach
    `top_p` is not tried."""
    size = probs.size
    largest = float(probs.max())
    falling, sums = _scratch(size)
    head = NUCLEUS_HEAD
    while True:
        if head * 2 > size:
            head = size
        elif head * largest < top_p:
            head *= 8
            continue
        values = falling[:head]
        np.negative(probs if head == size else np.partition(probs, size - head)[size - head :], out=values)
        values.sort()
        np.negative(values, out=values)  # contiguous: a running sum over a reversed view is ~3x slower
        running = np.cumsum(values, out=sums[:head])
        cut = int(np.searchsorted(running, top_p))
        if cut < head or head == size:
            break
        # Every value left is at most the head's last: at least (top_p - sum) / last more are
        # needed; try three times that (a 10k-token tail, where 8x would sort the whole row).
        least = (top_p - float(running[-1])) / max(float(values[-1]), 1e-300)
        head = max(head * 2, head + int(3 * least) + 1)
    cut = min(cut, size - 1)
    edge = values[cut]
    kept: np.ndarray = probs > edge
    kept[np.flatnonzero(probs == edge)[: cut + 1 - int(np.count_nonzero(kept))]] = True
    return kept


def draw(u: float, probs: np.ndarray) -> int:
    """The token at `u` (in [0, 1)) of the distribution's inverse CDF in id order: the first index
    whose normalised running sum exceeds `u`, as numpy's `choice` takes it from its one double.
    Zero-probability tokens leave the running sum exactly as it was (x + 0.0 == x), so the first
    sum above `u` is always at a token with a probability, and sums over the nonzero tokens alone
    would give the same index."""
    cdf = np.cumsum(probs, out=_scratch(probs.size)[0]) if probs.dtype == np.float64 else np.cumsum(probs)
    cdf /= cdf[-1]
    index = int(np.searchsorted(cdf, u, side="right"))
    return index if index < probs.size else int(np.flatnonzero(probs)[-1])


# Philox4x64-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011), the
# generator numpy's `Philox` bit generator implements: its multipliers and Weyl key increments.
_PHILOX_M = (np.uint64(0xD2E7470EE14C6C93), np.uint64(0xCA5A826395121157))
_PHILOX_W = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBB67AE8584CAA73B))
_LOW32, _32 = np.uint64(0xFFFFFFFF), np.uint64(32)


def _mulhilo(a: np.ndarray, b: np.uint64) -> tuple[np.ndarray, np.ndarray]:
    """The high and low 64 bits of a * b, from 32-bit halves (numpy has no 128-bit product)."""
    al, ah, bl, bh = a & _LOW32, a >> _32, b & _LOW32, b >> _32
    ll, lh, hl = al * bl, al * bh, ah * bl
    mid = (ll >> _32) + (lh & _LOW32) + (hl & _LOW32)
    return ah * bh + (lh >> _32) + (hl >> _32) + (mid >> _32), a * b


def philox(keys: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """Philox4x64-10's first output word for each (key, counter): key (k, 0), counter (c, 0, 0, 0).
    Equal to numpy's `Philox(key=[k, 0], counter=[c - 1, 0, 0, 0]).random_raw()` (it counts first)."""
    k0 = np.asarray(keys, np.uint64).copy()
    c0 = np.asarray(counters, np.uint64).copy()
    k1, c1, c2, c3 = (np.zeros_like(c0) for _ in range(4))
    with np.errstate(over="ignore"):
        for round_ in range(10):
            if round_:
                k0 += _PHILOX_W[0]
                k1 += _PHILOX_W[1]
            hi0, lo0 = _mulhilo(c0, _PHILOX_M[0])
            hi1, lo1 = _mulhilo(c2, _PHILOX_M[1])
            c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0


_MASK64 = (1 << 64) - 1
_M0, _M1, _W0, _W1 = (int(c) for c in (*_PHILOX_M, *_PHILOX_W))


def philox_one(key: int, counter: int) -> int:
    """`philox` of one (key, counter) in Python integers: ~20 us, where numpy's per-call overhead on
    one-element arrays costs ~0.7 ms (a sampled row draws one number per token)."""
    c0, c1, c2, c3, k0, k1 = counter & _MASK64, 0, 0, 0, key & _MASK64, 0
    for round_ in range(10):
        if round_:
            k0, k1 = (k0 + _W0) & _MASK64, (k1 + _W1) & _MASK64
        p0, p1 = _M0 * c0, _M1 * c2
        c0, c1, c2, c3 = (p1 >> 64) ^ c1 ^ k0, p1 & _MASK64, (p0 >> 64) ^ c3 ^ k1, p0 & _MASK64
    return c0


def uniform(keys: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """One double in [0, 1) per (key, counter): the top 53 bits of `philox`, as numpy's
    `Generator.random` makes a double of a 64-bit word."""
    return (philox(keys, counters) >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _one_hot(size: int, index: int) -> np.ndarray:
    probs = np.zeros(size, np.float64)
    probs[index] = 1.0
    return probs


@dataclass(frozen=True)
class TokenLogprobs:
    """One position's log-probabilities: the chosen token's, and the `top` most likely (id, logprob),
    most likely first (ties: the lower id first)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def log_probs(xp: Any, logits: Any, tokens: Any, top: int) -> tuple[Any, Any, Any]:
    """Log-softmax of raw logits [R, vocab] (numpy or cupy, computed where they live): the log-probability
    of each row's token [R], and of `top` most likely ids per row, unordered ([R, top] ids, values).
    Only these small arrays need to leave the device."""
    x = logits.astype(xp.float32)
    peak = x.max(axis=-1, keepdims=True)
    lse = peak + xp.log(xp.exp(x - peak).sum(axis=-1, keepdims=True))
    chosen = xp.take_along_axis(x, tokens.reshape(-1, 1), axis=-1)[:, 0] - lse[:, 0]
    if top <= 0:
        return chosen, None, None
    ids = xp.argpartition(-x, top - 1, axis=-1)[:, :top]
    return chosen, ids, xp.take_along_axis(x, ids, axis=-1) - lse


def token_logprobs(
    tokens: Sequence[int], chosen: np.ndarray, ids: np.ndarray | None, values: np.ndarray | None
) -> list[TokenLogprobs]:
    """Host arrays from `log_probs` as one TokenLogprobs per row, alternatives most likely first."""
    out = []
    for r, token in enumerate(tokens):
        top: tuple[tuple[int, float], ...] = ()
        if ids is not None and values is not None:
            pairs = sorted(zip(ids[r].tolist(), values[r].tolist(), strict=True), key=lambda p: (-p[1], p[0]))
            top = tuple((int(i), float(v)) for i, v in pairs)
        out.append(TokenLogprobs(int(token), float(chosen[r]), top))
    return out


class Constrained(Protocol):
    """A row's structured-output state (engine/constrain's RowState): what it allows, and advancing."""

    def allowed(self) -> np.ndarray: ...

    def advance(self, token: int) -> None: ...

    @property
    def state_key(self) -> Hashable: ...

    @property
    def done(self) -> bool: ...


class Sampler:
    """One request's (or one sample's) chooser: its parameters, its seeded generator, the tokens it
    chose (presence and frequency penalties count them) and, when asked, the log-probabilities of
    its last choice (`top_logprobs`: None = none, 0 = the chosen token's only, N = N alternatives)."""

    def __init__(
        self, params: SamplingParams, top_logprobs: int | None = None, constraint: Constrained | None = None
    ) -> None:
        params.validate()
        if top_logprobs is not None and not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {top_logprobs}")
        self.params = params
        # The generator's key: the seed, else a random one of this sampler's own.
        self.key = params.seed if params.seed is not None else secrets.randbits(64)
        self.counts: Counter[int] = Counter()
        self.top_logprobs = top_logprobs
        self.last: TokenLogprobs | None = None  # set by the engine after each choice when asked
        # Structured output (engine/constrain): which tokens may come next; advanced on each choice.
        self.constraint = constraint
        self.constraint_seconds = 0.0  # spent finding the allowed tokens (masks are cached per state)

    def allowed(self) -> np.ndarray | None:
        """The tokens the constraint allows next (None: every token), timed."""
        if self.constraint is None:
            return None
        started = time.perf_counter()
        allowed = self.constraint.allowed()
        self.constraint_seconds += time.perf_counter() - started
        return allowed

    def uniform(self, position: int) -> float:
        """The draw for the token at `position` of the sequence (counter-based: any order, any load)."""
        return (philox_one(self.key, position) >> 11) * 2.0**-53

    def penalize(self, logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        p = self.params
        allowed = self.allowed()
        if allowed is not None:  # before every other rule: the constrained distribution
            logits = np.where(allowed, logits, np.float32(-np.inf))
        logits = apply_repetition_penalty(logits, history, p.repetition_penalty)
        penalized: np.ndarray = apply_presence_frequency(
            logits, self.counts, p.presence_penalty, p.frequency_penalty
        )
        return penalized

    def chose(self, token: int) -> None:
        """Count a token this sampler chose and move its constraint past it (the engine calls it
        once per choice)."""
        self.counts[token] += 1
        if self.constraint is not None:
            self.constraint.advance(token)

    @property
    def constrained(self) -> bool:
        return self.constraint is not None

    @property
    def plain(self) -> bool:
        """Nothing but the logits and the parameters to go by (no constraint, penalty or
        log-probabilities): the device can choose it, greedy or sampled, with no word from the host."""
        return not self.params.penalized and self.constraint is None and self.top_logprobs is None

    def __call__(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        logits = self.penalize(logits, history)
        if self.params.greedy:
            return int(np.argmax(logits))
        probs = filtered_probabilities(logits, self.params)
        return draw(self.uniform(len(history)), probs)
