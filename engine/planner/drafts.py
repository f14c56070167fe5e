"""Prompt-lookup drafts for speculative decoding (issue #44): pure values, stdlib only.

When the last n tokens of a session occurred earlier in it, the k tokens that followed that earlier
occurrence are a draft of what comes next (code edits, extraction, summaries and JSON repeat their
input). `Lookup` keeps, for each n-gram length from `max_n` down to `min_n`, where each n-gram
last ended, so a draft costs `max_n` dictionary lookups whatever the session's length:

    lookup = Lookup(k=4)
    lookup.extend(prompt)
    lookup.propose()          # () or up to k tokens
    lookup.extend([token])    # as tokens are accepted

The longest suffix that occurred before wins; among its occurrences, the latest. A draft never
reads the suffix's own position (no occurrence overlaps the end), and is shorter than k only
where the earlier occurrence is followed by fewer tokens.

A verification forward runs the row's next token and its draft, k + 1 query rows, on one of
`VERIFY_WIDTHS` (a shorter draft is padded onto the next width and the padded rows rewound), so
speculation adds at most four shapes to a server's bounded set. A rejected drafted token costs
a row of the forward and yields nothing, so `Acceptance` decides, per row, how much of a draft
to verify from what its drafts have earned and what the forwards cost here (`Costs`, measured
as they run): measured, not guessed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

MAX_N = 3  # longest suffix matched (vLLM's ngram default is 1..4; 3 keeps false drafts rare)
MIN_N = 1
MAX_K = 8  # draft tokens a verification forward checks at most (its query rows: k + 1)
VERIFY_WIDTHS = (2, 3, 5, 9)  # the query widths of verification forwards (k = 1, 2, 4, 8)
MAX_WAIT = 16  # the longest wait, in steps, of a row whose drafts keep missing


def verify_width(rows: int) -> int:
    """The width a verification forward of `rows` real rows (a token and its draft) runs at."""
    for width in VERIFY_WIDTHS:
        if rows <= width:
            return width
    raise ValueError(f"{rows} rows: a verification forward checks at most {MAX_K} drafted tokens")


SMOOTHING = 0.2  # weight of the newest observation in the running figures below


def _ema(old: float | None, new: float) -> float:
    return new if old is None else old + SMOOTHING * (new - old)


@dataclass
class Costs:
    """What forwards cost on this machine, measured as they run (running averages): a decode step
    of one row, and a verification forward at each width. The engine keeps one (Engine.costs)."""

    step: float | None = None  # seconds of a one-row decode forward
    verify: dict[int, float] = field(default_factory=dict)  # width -> seconds

    def saw_step(self, seconds: float) -> None:
        self.step = _ema(self.step, seconds)

    def saw_verify(self, width: int, seconds: float) -> None:
        self.verify[width] = _ema(self.verify.get(width), seconds)

    def ratio(self, width: int) -> float:
        """A verification forward of `width` rows over a one-row step; until both are measured, the
        guess 1 + (width - 1) / 8 (a few more rows cost little where a step is bound by memory)."""
        verify = self.verify.get(width)
        if verify is None or not self.step:
            return 1.0 + (width - 1) / 8
        return verify / self.step


@dataclass
class Acceptance:
    """One row's drafting policy, from what its drafts earned: the chance that a drafted token is
    kept (a running estimate), and so how many tokens of a draft to verify: the count k that
    makes the most tokens per unit of cost, (1 + p + ... + p^k) / Costs.ratio(width of k + 1),
    against 1 for a plain step. When no k beats a plain step the row stops drafting and tries
    one token again after 1, 2, 4, ... MAX_WAIT steps, so a stream whose drafts start to fit
    finds out."""

    kept: float = 1.0  # drafted tokens kept and checked, decayed: p = kept / checked
    checked: float = 2.0
    wait: int = 0  # steps left before the next draft
    misses: int = 0  # times in a row no draft length paid

    @property
    def rate(self) -> float:
        return self.kept / self.checked

    def length(self, available: int, costs: Costs) -> int:
        """How many of `available` drafted tokens to verify now (0: a plain step)."""
        if available <= 0:
            return 0
        if self.wait:
            self.wait -= 1
            return 0
        best, gain = 0, 1.0
        expected, chance = 1.0, 1.0
        for k in range(1, min(available, MAX_K) + 1):
            chance *= self.rate
            expected += chance
            value = expected / costs.ratio(verify_width(k + 1))
            if value > gain:
                best, gain = k, value
        if best:
            self.misses = 0
            return best
        self.misses += 1
        self.wait = min(2 ** (self.misses - 1), MAX_WAIT)
        return 1  # a probe: one token, the cheapest check, so the estimate can move

    def verified(self, drafted: int, accepted: int) -> None:
        """A verification forward checked `drafted` tokens and kept the first `accepted`: each kept
        token was checked, and so was the first one refused."""
        if not drafted:
            return
        checked = accepted + (accepted < drafted)
        keep = (1 - SMOOTHING) ** checked
        self.kept = self.kept * keep + accepted
        self.checked = self.checked * keep + checked


@dataclass
class Lookup:
    k: int = 4
    max_n: int = MAX_N
    min_n: int = MIN_N
    tokens: list[int] = field(default_factory=list)
    # n-gram -> the end (exclusive) of its latest occurrence that is not the current suffix.
    _ends: dict[tuple[int, ...], int] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not 1 <= self.min_n <= self.max_n:
            raise ValueError(f"n-gram lengths {self.min_n}..{self.max_n}: need 1 <= min_n <= max_n")
        if not 1 <= self.k <= MAX_K:
            raise ValueError(f"k = {self.k}: a draft holds 1 to {MAX_K} tokens")
        held, self.tokens = self.tokens, []
        self.extend(held)

    def extend(self, new: Sequence[int]) -> None:
        """Append tokens; the suffix they push back becomes an earlier occurrence."""
        for token in new:
            end = len(self.tokens)  # the current suffix ends here: index it before it moves on
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self._ends[tuple(self.tokens[end - n : end])] = end
            self.tokens.append(token)

    def propose(self) -> tuple[int, ...]:
        """Up to k tokens that followed the latest earlier occurrence of the longest suffix found."""
        length = len(self.tokens)
        for n in range(min(self.max_n, length), self.min_n - 1, -1):
            end = self._ends.get(tuple(self.tokens[length - n :]))
            if end is not None and end < length:
                return tuple(self.tokens[end : end + self.k])
        return ()
