"""The session table, the engine's part that says which session holds which pool row.

A session opens on the lowest free row (from a prefix another row holds when the prompt starts
with one: prefix.py), closes leaving its row free (still keeping its prefix where it can), is
forked or copied onto another row, and, when a row is needed and every row is held, an idle one is
parked off the pool and comes back on its next touch (parking.py). `SessionTable` is the engine's
part that holds all this: it holds what it is given (`SessionTable.__init__` says what) and the
rows, and reaches nothing of the engine else; what needs a forward (a shorter fork's logits
computed again) the engine does after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.errors import InvalidInput
from engine.executor.decode import BatchDecoder
from engine.executor.parking import Parking
from engine.executor.prefilling import check_length
from engine.executor.prefix import HeldPrefixes, Hit
from engine.executor.session import Session
from engine.executor.step import Step
from engine.model import ModelInfo
from engine.planner import recompute_from
from engine.runtime.backend import Backend
from engine.runtime.pool import KvPool


def check_not_closed(session: Session) -> None:
    """A session that is not closed (parked or on a row)."""
    if session.closed:
        raise InvalidInput("session is closed")


class SessionTable:
    """Which session holds which pool row: `free`, the rows no session holds; `open`, the open
    sessions by the row whose KV they hold (the decoder reads the same mapping); and `parking`, the
    sessions off the pool. It is given the model, the backend, the pool, the held prefixes (a
    row a session leaves may keep its prefix), the decoder (settled before a row changes hands) and
    the chunk width (shared prefixes follow a fresh run's forwards, which start at chunk bounds)."""

    def __init__(
        self,
        info: ModelInfo,
        backend: Backend[Any],
        pool: KvPool,
        prefixes: HeldPrefixes,
        decoder: BatchDecoder,
        open_rows: dict[int, Session],
        chunk_size: int,
    ) -> None:
        self.info = info
        self.backend = backend
        self.pool = pool
        self.prefixes = prefixes
        self.decoder = decoder
        self.chunk_size = chunk_size
        self.free = set(range(pool.rows))  # pool rows no session holds
        self.open = open_rows  # pool row -> the session whose KV it holds
        self.parking = Parking(self)  # sessions beyond slots: parked off the pool (parking.py)

    @property
    def free_slots(self) -> int:
        """Rows free now, and rows a session nobody is using holds (parked when a row is needed)."""
        return len(self.free) + self.parking.parkable_count()

    @property
    def rows_held(self) -> int:
        """Pool rows sessions hold now, idle ones not yet parked included (an int: safe to read)."""
        return self.pool.rows - len(self.free)

    @property
    def sessions_open(self) -> int:
        return len(self.open) + len(self.parking.sessions)

    # -- parking: sessions beyond slots (parking.py) --------------------------------------------
    def park(self, session: Session) -> int:
        """Move an open session off its pool row: its KV positions [0, length) and next-token logits
        are copied off the pool, bit for bit, and the row is free. Its next touch brings it back
        into any free row (`check_open`). The bytes it holds parked."""
        check_not_closed(session)
        return self.parking.park(session)

    @property
    def parked_bytes(self) -> int:
        """What parked sessions hold (an int the worker keeps: safe to read from other threads)."""
        return self.parking.parked_bytes

    def make_room(self, rows: int) -> None:
        """Park idle sessions until `rows` rows are free, when fewer are (Exhausted when they cannot)."""
        if rows > len(self.free):
            self.parking.make_room(rows)

    def begin_step(self, step: Step) -> None:
        self.parking.begin_step(step.sessions())

    def end_step(self) -> None:
        self.parking.end_step()

    def check_open(self, session: Session) -> None:
        """An open session, on a pool row: a parked one comes back first (the one way back)."""
        check_not_closed(session)
        self.parking.touch(session)

    def open_session(self, scope: str, prompt: Sequence[int], fresh_forwards: bool) -> Session:
        """A session on the lowest free pool row (so decode batches stay narrow). When `prompt` starts
        with a prefix held for `scope` (whole units), the session starts holding it: taken as it is
        when that row keeps it, else copied; `session.length` says how much of the prompt it holds.
        `fresh_forwards`: whether shared prefixes keep to a fresh run's forwards (`_shareable`)."""
        self.make_room(1)
        self.decoder.settle()
        hit = self._shareable(self.prefixes.lookup(scope, prompt, self.open, -1), len(prompt), fresh_forwards)
        row = min(self.free)
        if hit and row in hit.rows:
            return self._start(row, scope, self.prefixes.held[row].tokens, hit.length)
        self.prefixes.vacate(row, self.free, hit.rows if hit else ())
        session = self._start(row, scope)
        if hit:
            self._copy_hit(hit, session)
        return session

    def _shareable(self, hit: Hit | None, prompt: int, fresh_forwards: bool) -> Hit | None:
        """The part of a held prefix worth copying: with fresh forwards (`Prefiller.fresh_forwards`)
        only up to where a fresh run of the prompt starts a forward (the rest is computed again anyway)."""
        if hit is None or not fresh_forwards:
            return hit
        length = recompute_from(hit.length, hit.length, prompt, self.chunk_size, True)
        return Hit(length, hit.rows) if length else None

    def _copy_hit(self, hit: Hit, session: Session) -> None:
        source = hit.rows[0]
        tokens, fresh = self.prefixes.tokens(source, self.open)
        self.prefixes.copy(source, session, hit.length, tokens, fresh)

    def _start(self, row: int, scope: str, tokens: Sequence[int] = (), length: int = 0) -> Session:
        """A new session on a free row that holds `tokens[:length]` (0: nothing)."""
        if not length:
            self.backend.clear_state(row)
        # A held prefix is shared only as far as it was written as a fresh run writes it.
        session = Session(row, 0, list(tokens[:length]), scope=scope, fresh=length)
        self.take_row(row, session, length, indexed=length)
        return session

    def take_row(self, row: int, session: Session, length: int, indexed: int = 0) -> None:
        """Row bookkeeping for `session` taking free `row`, where its KV holds `length` positions. The
        prefix index keeps the row's first `indexed` tokens (a held prefix taken as it is), no more."""
        self.free.discard(row)
        self.prefixes.held.pop(row, None)
        self.prefixes.index.truncate(row, indexed)
        session.row = row
        self.open[row] = session
        self.pool.commit(session, length)

    def leave_row(self, session: Session, keep: bool = False) -> None:
        """Row bookkeeping for a session leaving its row: free again and, unless `keep` and the row keeps
        the session's prefix (prefix.py), unindexed, unmasked and handed back (`release_row`)."""
        row = session.row
        del self.open[row]
        self.free.add(row)
        if not (keep and self.prefixes.keep(session)):
            self.prefixes.index.drop(row)
            self.pool.set_mask(row, 0)
            self.backend.release_row(row)

    def compact(self, sessions: Sequence[Session], width: int) -> int:
        """Put the open `sessions` (those about to decode together) on rows below `width`, the
        narrowest decode forward that holds them, so a forward's width follows how many rows decode
        and never which rows idle sessions of other callers hold (docs/api.md, Exactness). A
        session above moves onto a row below no decoding session holds: a free row first, then
        the row of the session used least recently, which takes its place. The moves made."""
        if self.info.recurrent_state:
            return 0
        decoding = {s.row for s in sessions}
        targets = sorted(
            (r for r in range(width) if r not in decoding),
            key=lambda r: (
                r in self.open,
                r in self.prefixes.held,
                self.open[r].used if r in self.open else 0,
                r,
            ),
        )
        movers = sorted((s for s in sessions if s.row >= width), key=lambda s: s.row)
        if not movers:
            return 0
        self.decoder.settle()
        for session, target in zip(movers, targets, strict=False):
            self._swap_rows(session, target)
        self.decoder.counters.rows_moved += len(movers)
        return len(movers)

    def _swap_rows(self, session: Session, target: int) -> None:
        """Move `session` onto pool row `target`, KV and next-token logits bit for bit; the session
        holding `target`, if any, takes `session`'s row, and a prefix held on it moves (prefix.py).
        The rows change hands through the table's own `leave_row`/`take_row`."""
        source, other = session.row, self.open.get(target)
        if other is None:
            self.prefixes.vacate(target, self.free, (source,))
        else:
            saved = self.backend.park_row(target, other.length)
            self.leave_row(other)
        self.backend.copy_rows(source, target, session.length)
        self.leave_row(session)
        self.take_row(target, session, session.length)
        if other is not None:
            self.backend.unpark_row(source, saved)
            self.take_row(source, other, other.length)

    def close_session(self, session: Session, keep: bool = True) -> None:
        """Return the session's row; with prefix sharing on it keeps the session's KV (prefix.py)."""
        if session.closed:
            return
        if session.parked is not None:  # no row: its parked copy goes
            self.parking.drop(session)
            session.closed = True
            return
        self.decoder.settle()
        session.closed = True
        self.leave_row(session, keep)

    def share_prefix(self, session: Session, prompt: Sequence[int], fresh_forwards: bool) -> int:
        """Start an empty session from the longest prefix of `prompt` another row holds for its scope
        (copied, whole units); the number of leading prompt tokens it now holds."""
        self.check_open(session)
        if session.length:
            return 0
        found = self.prefixes.lookup(session.scope, prompt, self.open, session.row)
        hit = self._shareable(found, len(prompt), fresh_forwards)
        if hit is None:
            return 0
        self.decoder.settle()
        self._copy_hit(hit, session)
        return hit.length

    def fork(self, source: Session, length: int) -> Session:
        """A new session holding a copy of `source`'s first `length` tokens, in the same scope; with
        all of them, `source`'s next-token logits too (a shorter fork's the engine computes again:
        `Engine.fork`)."""
        self.check_open(source)
        if self.info.recurrent_state:
            raise InvalidInput("a decoder with recurrent state cannot fork: its state has no length to cut")
        check_length(source, length)
        self.make_room(1)
        self.decoder.settle()
        row = min(self.free)
        self.prefixes.vacate(row, self.free)
        session = self._start(row, source.scope)
        session.padding_on = source.padding_on
        self.prefixes.copy(source.row, session, length, source.tokens, source.fresh)
        self.prefixes.counts["forks"] += 1
        if length == source.length:
            session.has_logits = source.has_logits
        return session

    def copy_session(self, source: Session, target: Session) -> None:
        """Make the open, empty `target` a copy of `source`: its tokens, KV rows and next-token
        logits, copied on the backend's device; no forward runs (n samples of one prefill)."""
        self.check_open(source)
        self.check_open(target)
        if self.info.recurrent_state:
            raise InvalidInput("a decoder with recurrent state cannot copy a session: its state has no rows")
        self.decoder.settle()
        self.prefixes.copy(source.row, target, source.length, source.tokens, source.fresh)
        target.has_logits, target.padding_on = source.has_logits, source.padding_on
