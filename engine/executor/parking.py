"""Parking: more sessions open than the KV pool has rows.

An open session nobody is using (`Session.parkable`, which the service sets between calls) may
leave its pool row for a session that needs one: its KV positions and next-token logits are
copied off the pool, bit for bit (`Backend.park_row`), and the row is free. Its next touch brings
it back into any free row. `Parking` holds the parked sessions, the bytes they hold and the
counts of moves (`ParkingStats`), and picks whom to park: the least recently used parkable
sessions the running step does not use whose copy fits the memory parked sessions may hold
(`limit`): parked bytes never exceed it, a swap (park one to unpark another) counting the one
leaving the park first. The rows stay the session table's: the table owns one Parking,
its one caller, and Parking moves sessions between rows with the table's own row bookkeeping
(`SessionTable.take_row`, `SessionTable.leave_row`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Protocol

from engine.errors import Exhausted, InvalidInput, NoFreeRow, ParkingFull
from engine.executor.decode import BatchDecoder
from engine.executor.prefix import HeldPrefixes
from engine.executor.session import Session
from engine.executor.stats import ParkingStats
from engine.model import ModelInfo
from engine.runtime.backend import Backend, ParkedRow
from engine.runtime.pool import KvPool


class Rows(Protocol):
    """The session table as Parking moves sessions between its rows: its free rows and open
    sessions by row, and the bookkeeping that takes and leaves a row (engine/executor/rows.py)."""

    info: ModelInfo
    backend: Backend[Any]
    pool: KvPool
    decoder: BatchDecoder
    prefixes: HeldPrefixes
    free: set[int]
    open: dict[int, Session]

    def take_row(self, row: int, session: Session, length: int, indexed: int = 0) -> None: ...

    def leave_row(self, session: Session, keep: bool = False) -> None: ...


class Parking:
    def __init__(self, table: Rows) -> None:
        self.table = table
        self.sessions: set[Session] = set()  # open sessions whose KV is off the pool (ParkedRow)
        # Parked since the engine last checked its bookkeeping: a parked session cannot change until
        # its next touch brings it back, so each is checked once, not every step (1,000s may park).
        self.unchecked: set[Session] = set()
        self.pinned: set[Session] = set()  # the running step's sessions: never parked to make room
        self.ticks = 0  # steps run: a session's `used` is the tick it was last touched at
        self.parked_bytes = 0  # what parked sessions hold (an int: read from other threads)
        # Parked copies in device memory, and how many bytes of them it may hold before the most
        # idle spill to host memory (`Engine.limit_parked_on_device`; None = no limit: nothing spills).
        self.device_bytes = 0
        self.device_limit: int | None = None
        self.limit: int | None = None  # bytes parked copies may hold in all (None = no limit)
        self.spills = 0
        self._moves = {"parks": 0, "unparks": 0}
        self._seconds = {"park": 0.0, "unpark": 0.0}

    def begin_step(self, sessions: set[Session]) -> None:
        """A step starts: the clock ticks, and its sessions keep their rows until it ends."""
        self.ticks += 1
        self.pinned = sessions

    def end_step(self) -> None:
        self.pinned = set()

    def touch(self, session: Session) -> None:
        """An open session is used: it is the most recently used, back on a pool row if it was parked."""
        session.used = self.ticks
        if session.parked is not None:
            self.unpark(session)

    def park(self, session: Session) -> int:
        """`Engine.park` of an open session: its KV and logits copied off its row, bit for bit, and
        the row free; its next `touch` brings it back. The bytes it holds parked."""
        if session.parked is not None:
            return int(session.parked.nbytes)
        table = self.table
        if table.info.recurrent_state:
            raise InvalidInput("a decoder with recurrent state cannot park a session: its state is not KV")
        table.decoder.settle()
        started = time.perf_counter()
        parked = table.backend.park_row(session.row, session.length)
        if self.limit is not None and self.parked_bytes + int(parked.nbytes) > self.limit:
            raise ParkingFull(
                f"parked sessions hold {self.parked_bytes} of the {self.limit} bytes they "
                f"may; parking one more would take {int(parked.nbytes)}"
            )
        session.parked = parked
        table.leave_row(session)
        session.row = -1
        self.sessions.add(session)
        self.unchecked.add(session)
        nbytes = self._count(session.parked, +1)
        self._spill()
        self._moves["parks"] += 1
        self._seconds["park"] += time.perf_counter() - started
        return nbytes

    def _count(self, parked: ParkedRow, sign: int) -> int:
        """Add (+1) or take away (-1) a parked copy's bytes from the totals; its bytes."""
        nbytes = int(parked.nbytes)
        self.parked_bytes += sign * nbytes
        self.device_bytes += sign * nbytes if parked.on_device else 0
        return nbytes

    def _spill(self) -> None:
        """Past the device limit, the parked sessions idle longest move to host memory, until the
        device's parked copies fit again (device memory first, then host, by idleness)."""
        if self.device_limit is None or self.device_bytes <= self.device_limit:
            return
        on_device = sorted(
            (s for s in self.sessions if s.parked is not None and s.parked.on_device), key=lambda s: s.used
        )
        for session in on_device:
            if self.device_bytes <= self.device_limit:
                break
            assert session.parked is not None
            self.device_bytes -= int(session.parked.nbytes)
            session.parked = self.table.backend.spill_row(session.parked)
            self.spills += 1

    def unpark(self, session: Session) -> None:
        """Bring a parked session back into the lowest free row (parking another to make room)."""
        table = self.table
        assert session.parked is not None
        nbytes = int(session.parked.nbytes)
        self.parked_bytes -= nbytes  # first: a swap fits the limit whenever its outcome does
        try:
            started = time.perf_counter()
            row = self._free_row()
            parked = session.parked  # read after: making room may have spilled it to host memory
            assert parked is not None
            table.backend.unpark_row(row, parked)  # first: if it fails the session is still parked, whole
        except BaseException:
            self.parked_bytes += nbytes
            raise
        self.device_bytes -= nbytes if parked.on_device else 0
        session.parked = None
        self.sessions.discard(session)
        self.unchecked.discard(session)
        table.take_row(row, session, session.length)
        self._moves["unparks"] += 1
        self._seconds["unpark"] += time.perf_counter() - started

    def _free_row(self) -> int:
        """The lowest free row, parking another session to make one (it waits for a row: the
        scheduler retries it), vacated of any prefix it kept."""
        table = self.table
        if not table.free:
            self.make_room(1, NoFreeRow)
        table.decoder.settle()
        row = min(table.free)
        table.prefixes.vacate(row, table.free)
        return row

    def drop(self, session: Session) -> None:
        """A parked session closes: its parked copy goes."""
        self._count(session.parked, -1)
        session.parked = None
        self.sessions.discard(session)
        self.unchecked.discard(session)

    def parkable(self) -> list[Session]:
        """Sessions that may leave their row for one who needs it, least recently used first."""
        return sorted(self._idle(), key=lambda s: s.used)

    def parkable_count(self) -> int:
        """How many sessions `parkable` names, without ordering them (free slots, every round)."""
        return sum(1 for _ in self._idle())

    def _idle(self) -> Iterator[Session]:
        """Open sessions nobody is using that the running step does not name (none with recurrent state)."""
        if not self.table.info.recurrent_state:
            yield from (s for s in self.table.open.values() if s.parkable and s not in self.pinned)

    def make_room(self, rows: int, error: type[Exhausted] = Exhausted) -> None:
        """Park the least recently used parkable sessions that fit the limit until `rows` rows are
        free; `error` if every row is held by a session in use (a new session fails at once, a parked
        one waits), ParkingFull if the limit stood in the way (a parked one fails too when every row
        holds an idle session: waiting would free none)."""
        free, full = self.table.free, None
        for session in self.parkable():
            if len(free) >= rows:
                break
            try:
                self.park(session)
            except ParkingFull as refused:  # a shorter session may still fit
                full = refused
        if len(free) < rows:
            if full is not None and (error is not NoFreeRow or self._only_idle_rows()):
                raise full  # waiting frees nothing: every row holds an idle session too big to park
            raise error(
                f"all {self.table.pool.rows} KV slots hold sessions in use ({len(free)} free, {rows} needed)"
            )

    def _only_idle_rows(self) -> bool:
        """Whether every row is free or holds a session nobody uses (none will end a call soon)."""
        return len(self.table.free) + self.parkable_count() >= self.table.pool.rows

    def stats(self) -> ParkingStats:
        return ParkingStats(
            sessions_parked=len(self.sessions),
            parked_bytes=self.parked_bytes,
            parks=self._moves["parks"],
            unparks=self._moves["unparks"],
            park_seconds=self._seconds["park"],
            unpark_seconds=self._seconds["unpark"],
            device_bytes=self.device_bytes,
            spills=self.spills,
            released_bytes=int(getattr(self.table.backend, "released_bytes", 0)),
        )
