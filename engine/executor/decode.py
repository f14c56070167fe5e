"""Decode forwards over the KV pool: one forward advances every session in the step.

A forward binds pool rows [0, B), B on the batch ladder. Rows in the step get
their token and advance by one; the other rows ride along: their mask is set
to `ride_along_length` for the forward (so GQA writes where nothing is read)
and put back after, their outputs are never kept.

Lookahead (backends that can launch a forward without waiting): once a step's
tokens are chosen, the next forward of the same rows is launched on those
tokens before the caller has even seen them, so the host's work between two
steps overlaps the device's. The next step takes it when it feeds exactly
those tokens to exactly those rows (a hit); otherwise it is dropped: it wrote
only one position past each row's length, which nothing reads.

Chain (a hit whose rows all choose with nothing but their logits and parameters, greedy or
sampled, on a backend that `chains`): the step does not wait for the forward in flight at all. It
queues behind it on the device the keeping of the rows' logits, the choice (an argmax or a seeded
draw) that writes each token into the next forward's ids and moves its mask,
and the next forward itself, then waits only for the tokens, while that next forward runs. The
device goes from forward to forward without a host round trip (measured on the H200: the host's
0.5 ms between two forwards was a fifth of a 64-row step of a 0.8 B model).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.executor.session import Session
from engine.planner import decode_batch_width, ride_along_length
from engine.runtime.backend import Backend
from engine.runtime.pool import KvPool
from engine.runtime.variants import Variant, VariantKey
from engine.sampling import Sampler


@dataclass
class Ahead:
    """A decode forward launched before it was asked for."""

    batch: int
    feeds: dict[int, int]
    lengths: list[int]  # the rows' committed lengths when it was launched
    logits: Any
    settled: bool = False

    def takes(self, batch: int, feeds: dict[int, int]) -> bool:
        """Whether it is the forward a step of these rows on these tokens runs (a hit)."""
        return self.batch == batch and self.feeds == feeds


@dataclass
class DecodeCounters:
    steps: int = 0
    rows: int = 0
    ride_along_rows: int = 0
    batch_use: Counter[int] = field(default_factory=Counter)
    last_batch: int = 0
    lookahead_hits: int = 0
    lookahead_misses: int = 0
    lookahead_launched: int = 0
    chained: int = 0  # lookahead hits whose next forward was queued on the device (the chain)
    rows_moved: int = 0  # sessions moved to a lower row so the forward stays narrow (Engine.compact)
    verify_forwards: int = 0  # forwards that verified a drafted row (Engine.verify)
    drafted: int = 0  # drafted tokens they checked
    accepted: int = 0  # ... and kept
    accepted_use: Counter[int] = field(default_factory=Counter)  # accepted per forward -> forwards

    def verified(self, drafted: int, accepted: int) -> None:
        self.verify_forwards += 1
        self.drafted += drafted
        self.accepted += accepted
        self.accepted_use[accepted] += 1


def _committed(lengths: list[int], feeds: Mapping[int, int]) -> list[int]:
    """Every row's length once the rows in `feeds` hold their token."""
    return [n + (row in feeds) for row, n in enumerate(lengths)]


class BatchDecoder:
    def __init__(
        self,
        pool: KvPool,
        backend: Backend[Any],
        variant: Callable[[VariantKey], Variant | None],
        sessions: Mapping[int, Session],
        capacity: int,
    ) -> None:
        self.pool = pool
        self.backend = backend
        self.variant = variant
        self.sessions = sessions
        self.capacity = capacity
        self.counters = DecodeCounters()
        self._ahead: Ahead | None = None
        self._last_rows: frozenset[int] = frozenset()
        # The batch width that binds each row, looked up rather than planned every step.
        self._width = [decode_batch_width(row, pool.rows) for row in range(pool.rows)]
        self.least = 1  # the narrowest forward (engine/executor/kernels.py: 2 where one row differs)

    def width(self, rows: int, least: int = 1) -> int:
        """The batch width of a forward of `rows` rows, at least `least` wide (pool rows [0, width))."""
        return self._width[min(max(rows, least, self.least), len(self._width)) - 1]

    def forward(self, feeds: dict[int, int], least: int = 1) -> None:
        """Advance the rows in `feeds` by their token in one forward of at least `least` rows."""
        self.step(feeds, lambda _: [], ahead=False, least=least)

    def step(
        self,
        feeds: dict[int, int],
        choose: Callable[[list[int] | None], list[int]],
        ahead: bool,
        least: int = 1,
        plain: Sequence[Sampler] | None = None,
    ) -> list[int]:
        """Advance the rows in `feeds` by their token, `choose` the next tokens and, with `ahead`,
        launch the forward that feeds them before returning. `plain`: the rows' samplers, in the
        order of `feeds`, when every one is `Sampler.plain` (the tokens may then be chosen on the
        device, the chain; `choose` then gets them).

        The order keeps the device busy: once a forward is done, its logits are kept and the
        next tokens chosen on the device, the next forward is launched, and only then does
        the host do its bookkeeping."""
        batch = self._width[max(max(feeds), least - 1, self.least - 1)]
        if ahead and plain is not None:
            tokens = self._chain(batch, feeds, plain)
            if tokens is not None:
                return choose(tokens)
        logits, lengths = self._take_ahead(batch, feeds)
        if logits is None:
            ids, positions = self._masks(batch, feeds, lengths)
            key = VariantKey(1, (), batch)
            try:
                logits = self.backend.run_batch(self.variant(key), key, ids, positions)
            except BaseException:
                self._restore(batch, lengths)
                raise
        try:
            self.backend.keep_batch(sorted(feeds), logits)
        except BaseException:
            self._restore(batch, lengths)  # a hit's rows still hold the masks it ran with
            raise
        self._commit(feeds)
        committed = _committed(lengths, feeds)
        tokens = choose(None)
        if not (ahead and self._look_ahead(batch, dict(zip(feeds, tokens, strict=True)), committed)):
            self._restore(batch, committed)
        self._count(batch, feeds)
        return tokens

    def _chain(self, batch: int, feeds: dict[int, int], samplers: Sequence[Sampler]) -> list[int] | None:
        """The chain, when the forward in flight is this step's and the next fits: the step's rows
        committed, the next forward launched behind the device's choice of their tokens; the
        tokens. None when it does not apply (nothing was done)."""
        ahead = self._ahead
        if not (
            self.backend.chains
            and ahead is not None
            and not ahead.settled
            and ahead.takes(batch, feeds)
            and all(ahead.lengths[row] + 2 <= self.capacity for row in feeds)
        ):
            return None
        lengths, rows = ahead.lengths, list(feeds)
        committed = _committed(lengths, feeds)
        key = VariantKey(1, (), batch)
        try:
            tokens = self.backend.chain_batch(
                self.variant(key), key, rows, ahead.logits, [committed[row] for row in rows], samplers
            )
        except BaseException:
            self.backend.settle()
            self._ahead = None
            for row in rows:  # the device may have moved it one further: put back from there
                self.pool.moved(row, committed[row] + 1)
            self._restore(batch, lengths)
            raise
        if tokens is None:
            return None
        self._commit(feeds)  # their masks were there already (the forward in flight ran with them)
        for row in rows:
            self.pool.moved(row, committed[row] + 1)  # the device moves it for the forward now in flight
        self._ahead = Ahead(batch, dict(zip(rows, tokens, strict=True)), committed, ahead.logits)
        c = self.counters
        c.lookahead_hits += 1
        c.lookahead_launched += 1
        c.chained += 1
        self._count(batch, feeds)
        return tokens

    def _commit(self, feeds: dict[int, int]) -> None:
        """The rows in `feeds` now hold their token: one longer, and their logits are the next token's."""
        for row, token in feeds.items():
            session = self.sessions[row]
            self.pool.commit(session, session.length + 1)
            session.tokens.append(token)
            session.has_logits = True

    def _look_ahead(self, batch: int, feeds: dict[int, int], committed: list[int]) -> bool:
        """Launch the next forward of these rows on these tokens, without waiting; False if not launched."""
        stable = frozenset(feeds) == self._last_rows
        roomy = all(committed[row] + 1 <= self.capacity for row in feeds)
        if not (stable and roomy and self.backend.async_capable):
            return False
        ids, positions = self._masks(batch, feeds, committed)
        key = VariantKey(1, (), batch)
        logits = self.backend.run_batch(self.variant(key), key, ids, positions, wait=False)
        self._ahead = Ahead(batch, feeds, committed, logits)
        self.counters.lookahead_launched += 1
        return True

    @property
    def in_flight(self) -> bool:
        """Whether a lookahead forward was launched and not yet settled (its masks are set)."""
        return self._ahead is not None and not self._ahead.settled

    def settle(self) -> None:
        """Wait for a launched lookahead and put the masks back (before anything touches the pool)."""
        if self._ahead is not None:
            self._settle(self._ahead)

    def _settle(self, ahead: Ahead, keep: Container[int] = ()) -> None:
        """Wait for the launched forward and put its rows' masks back, but for the rows in `keep`."""
        if not ahead.settled:
            self.backend.settle()
            self._restore(ahead.batch, ahead.lengths, keep)  # nothing touched these rows since: committed
            ahead.settled = True

    def _take_ahead(self, batch: int, feeds: dict[int, int]) -> tuple[Any, list[int]]:
        """The launched forward's logits if it is this one, else None; and the rows' committed lengths.

        The lengths are read after settling, never taken from the launch: a row outside the
        step may have been opened, prefilled or rewound since (each settles first). Unless the
        forward is this one and still in flight: then nothing touched the pool since its launch
        (anything that does settles first), so the launch's lengths are the committed ones, and
        the step's rows keep the masks it ran with (one past each length), which is what the step
        commits them to: moving them back and forth again would change nothing."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None, self.pool.mask_lengths[:batch]
        hit = ahead.takes(batch, feeds)
        if hit and not ahead.settled:
            self._settle(ahead, keep=feeds)
            lengths = ahead.lengths
        else:
            self._settle(ahead)
            lengths = self.pool.mask_lengths[:batch]
        if hit:
            self.counters.lookahead_hits += 1
        else:
            self.counters.lookahead_misses += 1
        return ahead.logits if hit else None, lengths

    def _masks(self, batch: int, feeds: dict[int, int], lengths: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and positions of one forward; each row's mask set for it."""
        ids = np.zeros((batch, 1), np.int64)
        for row in range(batch):
            ids[row, 0] = feeds.get(row, 0)
            length = lengths[row]
            self.pool.set_mask(row, length + 1 if row in feeds else ride_along_length(length, self.capacity))
        positions = np.asarray(self.pool.mask_lengths[:batch], np.int64).reshape(batch, 1) - 1
        return ids, positions

    def _restore(self, batch: int, lengths: list[int], keep: Container[int] = ()) -> None:
        """Put the masks of rows [0, batch) back to `lengths`, but for the rows in `keep`."""
        for row in range(batch):
            if row not in keep:
                self.pool.set_mask(row, lengths[row])

    def _count(self, batch: int, feeds: dict[int, int]) -> None:
        c = self.counters
        c.steps += 1
        c.rows += len(feeds)
        c.ride_along_rows += batch - len(feeds)
        c.batch_use[batch] += 1
        c.last_batch = batch
        self._last_rows = frozenset(feeds)
