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
speculation adds at most four shapes to a server's bounded set. `Backoff` decides, per row,
whether to draft at all: a draft none of whose tokens is accepted costs a forward wider than a
step for the one token it yields, so after a miss a row waits 1, 2, 4, ... steps (at most
MAX_WAIT) before it drafts again, and any accepted token brings the wait back to none.
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


@dataclass
class Backoff:
    """Whether a row drafts this step: not while it waits after drafts that missed."""

    wait: int = 0  # steps left before the next draft
    misses: int = 0  # drafts in a row that had no token accepted

    def drafts(self) -> bool:
        """Whether to draft now (a step that does not counts down the wait)."""
        if self.wait:
            self.wait -= 1
            return False
        return True

    def verified(self, drafted: int, accepted: int) -> None:
        """A verification forward checked `drafted` tokens and accepted `accepted` of them."""
        if drafted and not accepted:
            self.misses += 1
            self.wait = min(2 ** (self.misses - 1), MAX_WAIT)
        elif accepted:
            self.misses = self.wait = 0


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
