"""Token prefixes the KV pool holds, found by the chained hashes of their whole chunks.

A prefix is shared in whole chunks of the model's chunk width W only, and at
least one token short of the prompt (its last token must run to give logits).
The request then prefills the rest from past = k·W, so its forwards are exactly
those a request prefilling everything would run from there on: the same chunk
boundaries, the same ladder widths. Hash k chains hash k-1 with chunk k's tokens,
so one hash names a whole prefix; a hit is confirmed by comparing the tokens
themselves, so neither a collision nor a stale entry can ever share wrong KV.

Pure Python (no onnxruntime): the engine says which rows hold which tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Hit:
    """The longest held prefix of a prompt: `length` tokens (whole chunks), held by each of `rows`."""

    length: int
    rows: tuple[int, ...]


@dataclass
class Held:
    """A free pool row that keeps the KV of the session that last had it, until a session needs the row."""

    tokens: list[int]
    scope: str  # who may share it ("" = anyone)
    used: int  # LRU tick: the least recently used held row is evicted first


def chain(tokens: Sequence[int], chunk: int, count: int) -> list[int]:
    """The chained hashes of the first `count` whole chunks of `tokens`."""
    hashes: list[int] = []
    previous = 0
    for k in range(count):
        previous = hash((previous, tuple(tokens[k * chunk:(k + 1) * chunk])))
        hashes.append(previous)
    return hashes


class PrefixIndex:
    """Which pool rows hold which prefixes, in whole chunks; kept in step lazily with the rows' tokens."""

    def __init__(self, chunk: int) -> None:
        self.chunk = chunk
        self._hashes: dict[int, list[int]] = {}  # row -> chained hashes of the whole chunks it holds
        self._rows: dict[int, set[int]] = {}  # hash -> rows holding that prefix

    def sync(self, row: int, tokens: Sequence[int]) -> None:
        """Index the whole chunks `tokens` holds beyond those already indexed for `row` (they only grow
        between truncations, which the engine reports)."""
        hashes = self._hashes.setdefault(row, [])
        whole = len(tokens) // self.chunk
        if whole <= len(hashes):
            return
        previous = hashes[-1] if hashes else 0
        for k in range(len(hashes), whole):
            previous = hash((previous, tuple(tokens[k * self.chunk:(k + 1) * self.chunk])))
            hashes.append(previous)
            self._rows.setdefault(previous, set()).add(row)

    def truncate(self, row: int, length: int) -> None:
        """`row` keeps only its first `length` tokens."""
        hashes = self._hashes.get(row)
        if not hashes:
            return
        keep = length // self.chunk
        for h in hashes[keep:]:
            rows = self._rows.get(h)
            if rows is not None:
                rows.discard(row)
                if not rows:
                    del self._rows[h]
        del hashes[keep:]

    def drop(self, row: int) -> None:
        self.truncate(row, 0)
        self._hashes.pop(row, None)

    def find(self, prompt: Sequence[int], candidates: Mapping[int, Sequence[int]]) -> Hit | None:
        """The longest prefix of `prompt`, in whole chunks and at least one token short of it, that rows
        in `candidates` (row -> the tokens it holds) hold; None when not even one chunk is held."""
        for row, tokens in candidates.items():
            self.sync(row, tokens)
        wanted = chain(prompt, self.chunk, (len(prompt) - 1) // self.chunk)
        for k in range(len(wanted), 0, -1):
            length = k * self.chunk
            rows = tuple(sorted(r for r in self._rows.get(wanted[k - 1], ())
                                if r in candidates and list(candidates[r][:length]) == list(prompt[:length])))
            if rows:
                return Hit(length, rows)
        return None

    def indexed_rows(self) -> int:
        return sum(1 for hashes in self._hashes.values() if hashes)
