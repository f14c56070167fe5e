"""Token prefixes the KV pool holds (found by the chained hashes of their whole units), and the free
rows that keep a closed session's KV until a session needs the row.

A prefix is found in whole units U = the ladder step of the model's chunk width
(`engine.planner.prefix_unit`: 171 for 512): hash k chains hash k-1 with unit k's
tokens, so one hash names a whole prefix, and a hit is confirmed by comparing the
tokens themselves, so neither a collision nor a stale entry can ever share wrong
KV. From the longest whole-unit hit the match then runs on token by token (fewer
than U more) as far as the holder's tokens and the prompt agree, up to two tokens
short of the prompt: a 2,000-token system prompt is shared whole, not cut back to
1,881. The request then prefills the rest from past = the shared length, planned by
the same planner as any prefill, so its forwards stay on the ladder. Why two: the
last token must run to give logits, and a rest of one row would run the decode
shape, whose arithmetic differs from a prefill forward's in the last bits, so a
repeated request's log-probabilities would change with what the pool holds; a rest
of two or more rows is a ladder forward, whose rows come out as a full prefill's.

A held row's mask stays at its length, so rows riding along in a decode forward
write past it, where nothing is read. New sessions still take the lowest free row
(decode batches stay narrow): a prefix held there moves to the highest free row
holding none, or over the least recently used one, or is dropped when it is the
least recently used itself. The KV is copied by the backend (`copy_rows`), on the
device that holds it; nothing here touches onnxruntime.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.executor.session import Session
from engine.executor.stats import PrefixStats
from engine.runtime.backend import Backend
from engine.runtime.pool import KvPool


@dataclass(frozen=True)
class Hit:
    """The longest held prefix of a prompt: `length` tokens, held by each of `rows`."""

    length: int
    rows: tuple[int, ...]


@dataclass
class Held:
    """A free pool row that keeps the KV of the session that last had it, until a session needs the row."""

    tokens: list[int]
    fresh: int  # leading rows written as a fresh run writes them: shared at most this far
    scope: str  # who may share it ("" = anyone)
    used: int  # LRU tick: the least recently used held row is evicted first


def chain(tokens: Sequence[int], unit: int, count: int) -> list[int]:
    """The chained hashes of the first `count` whole units of `tokens`."""
    hashes: list[int] = []
    previous = 0
    for k in range(count):
        previous = hash((previous, tuple(tokens[k * unit : (k + 1) * unit])))
        hashes.append(previous)
    return hashes


SHORT = 2  # a shared prefix leaves at least this many prompt tokens to prefill (a ladder forward)


def agreed(held: list[int], prompt: list[int], start: int, stop: int) -> int:
    """Where the run of positions from `start` (before `stop`) on which `held` and `prompt` agree ends:
    a binary search over slice comparisons, so many holders cost little."""
    low, high = start, stop  # held[start:low] == prompt[start:low]; the run ends at or before high
    while low < high:
        middle = (low + high + 1) // 2
        if held[low:middle] == prompt[low:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def run_on(prompt: list[int], length: int, holders: Mapping[int, list[int]]) -> Hit:
    """The hit of the holders that agree with `prompt` furthest past their common `length` tokens,
    stopping SHORT tokens short of the prompt."""
    limit = len(prompt) - SHORT
    reach = {row: agreed(tokens, prompt, length, min(limit, len(tokens))) for row, tokens in holders.items()}
    best = max(reach.values())
    return Hit(best, tuple(sorted(r for r, end in reach.items() if end == best)))


class PrefixIndex:
    """Which pool rows hold which prefixes, in whole units; kept in step lazily with the rows' tokens."""

    def __init__(self, unit: int) -> None:
        self.unit = unit
        self._hashes: dict[int, list[int]] = {}  # row -> chained hashes of the whole units it holds
        self._rows: dict[int, set[int]] = {}  # hash -> rows holding that prefix

    def sync(self, row: int, tokens: Sequence[int]) -> None:
        """Index the whole units `tokens` holds beyond those already indexed for `row` (they only grow
        between truncations, which the engine reports)."""
        hashes = self._hashes.setdefault(row, [])
        whole = len(tokens) // self.unit
        if whole <= len(hashes):
            return
        previous = hashes[-1] if hashes else 0
        for k in range(len(hashes), whole):
            previous = hash((previous, tuple(tokens[k * self.unit : (k + 1) * self.unit])))
            hashes.append(previous)
            self._rows.setdefault(previous, set()).add(row)

    def truncate(self, row: int, length: int) -> None:
        """`row` keeps only its first `length` tokens."""
        hashes = self._hashes.get(row)
        if not hashes:
            return
        keep = length // self.unit
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
        """The longest prefix of `prompt`, at least two tokens short of it, that rows in `candidates`
        (row -> the tokens it holds) hold: found in whole units, then run on token by token; None when
        not even one whole unit is held."""
        for row, tokens in candidates.items():
            self.sync(row, tokens)
        wanted = chain(prompt, self.unit, (len(prompt) - SHORT) // self.unit)
        for k in range(len(wanted), 0, -1):
            length = k * self.unit
            hashed = [r for r in self._rows.get(wanted[k - 1], ()) if r in candidates]
            if not hashed:
                continue
            # Lists on both sides, made once: a tuple never equals a list, and slices then compare.
            asked = list(prompt)
            held = {r: list(candidates[r]) for r in hashed}
            holders = {r: tokens for r, tokens in held.items() if tokens[:length] == asked[:length]}
            if holders:
                return run_on(asked, length, holders)
        return None


class HeldPrefixes:
    """Which rows hold which prefixes (live sessions' and held free rows'), and the held rows themselves."""

    def __init__(
        self, pool: KvPool, backend: Backend[Any], unit: int, enabled: bool, position_bytes: int
    ) -> None:
        self.pool = pool
        self.backend = backend
        self.unit = unit
        self.enabled = enabled
        self.position_bytes = position_bytes
        self.index = PrefixIndex(max(unit, 1))
        self.held: dict[int, Held] = {}
        self.counts = {"lookups": 0, "hits": 0, "tokens_saved": 0, "forks": 0, "evictions": 0}
        self._ticks = 0

    def _tick(self) -> int:
        self._ticks += 1
        return self._ticks

    def keep(self, session: Session) -> bool:
        """Keep a closing session's row (at least one whole unit of known tokens); False: not kept."""
        if not (self.enabled and len(session.tokens) == session.length >= self.unit):
            self.index.drop(session.row)
            return False
        self.held[session.row] = Held(session.tokens, session.fresh, session.scope, self._tick())
        return True

    def lookup(
        self, scope: str, prompt: Sequence[int], live: Mapping[int, Session], exclude: int
    ) -> Hit | None:
        """The longest prefix of `prompt` held for `scope` by any row but `exclude`."""
        if not (self.enabled and prompt):
            return None
        # Rows a decode step wrote are never shared: a fresh run computes them in a prefill forward.
        candidates = {r: s.tokens[: s.fresh] for r, s in live.items() if s.scope == scope and r != exclude}
        candidates.update({r: h.tokens[: h.fresh] for r, h in self.held.items() if h.scope == scope})
        self.counts["lookups"] += 1
        hit = self.index.find(prompt, candidates)
        if hit is not None:
            self.counts["hits"] += 1
            self.counts["tokens_saved"] += hit.length
            used = self._tick()
            for row in hit.rows:
                if row in self.held:
                    self.held[row].used = used
        return hit

    def vacate(self, row: int, free: set[int], keep: Sequence[int] = ()) -> None:
        """Free `row` of the prefix it holds: moved to the highest free row holding none, or over the
        least recently used one another free row holds (not one of `keep`), or dropped if it is the
        least recently used itself."""
        held = self.held.pop(row, None)
        if held is None:
            return
        plain = free - self.held.keys() - {row}
        others = [r for r in self.held if r not in keep]
        target = max(plain) if plain else min(others, key=lambda r: self.held[r].used, default=None)
        if not plain:
            self.counts["evictions"] += 1
            if target is None or self.held[target].used > held.used:
                return
        assert target is not None
        self.backend.copy_rows(row, target, len(held.tokens))
        self.pool.set_mask(target, len(held.tokens))
        self.index.drop(target)
        self.held[target] = held

    def copy(self, src: int, session: Session, length: int, tokens: Sequence[int], fresh: int) -> None:
        """`session` (on its own row) holds a copy of row `src`'s first `length` tokens, of which
        the first `fresh` were written as a fresh run writes them."""
        self.backend.copy_rows(src, session.row, length)
        self.pool.commit(session, length)
        session.fresh = min(fresh, length)
        session.tokens = list(tokens[:length])

    def tokens(self, row: int, live: Mapping[int, Session]) -> tuple[list[int], int]:
        """The tokens a row holds and how many of them are fresh."""
        if row in live:
            return live[row].tokens, live[row].fresh
        return self.held[row].tokens, self.held[row].fresh

    def stats(self) -> PrefixStats:
        held = sum(len(h.tokens) for h in self.held.values())
        return PrefixStats(
            self.enabled, rows_held=len(self.held), bytes_held=held * self.position_bytes, **self.counts
        )
