"""Compiled constraints kept by (kind, spec): a thread-safe LRU under a byte budget.

Compiles run on a thread pool: a second request for a key being compiled waits for that
compile instead of starting its own; a spec that failed fails again from a small memory of
errors without compiling. Each caller brings a Budget (budget.py): the compiling one's bounds the
compile; an abandoned compile is remembered by nobody, and a caller still waiting for it compiles
the spec itself (one waiting caller's leaving stops only its wait). The byte budget counts each
constraint's table and the masks it has cached so far (they grow as rows reach new states); the
least recently used go first, never the one just asked for. Rows of an evicted constraint keep
working: they hold it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine.constrain.budget import UNBOUNDED, Abandoned, Budget
from engine.constrain.compiled import Compiled, compile_constraint
from engine.constrain.limits import DEFAULT_LIMITS, Limits
from engine.constrain.vocabulary import Vocabulary
from engine.errors import InvalidInput

Key = tuple[str, str | tuple[str, ...]]
Compile = Callable[[str, "str | Sequence[str]", Vocabulary, Limits], Compiled]  # a test's stand-in
WAIT_CHECK_S = 0.05  # how often a caller waiting for another's compile looks whether it has left


@dataclass(frozen=True)
class CacheStats:
    hits: int
    misses: int
    compile_seconds: float
    entries: int
    nbytes: int
    evictions: int


class _Pending:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: Compiled | None = None
        self.error: InvalidInput | None = None
        self.abandoned = False


class ConstraintCache:
    def __init__(
        self,
        vocabulary: Vocabulary,
        limits: Limits = DEFAULT_LIMITS,
        max_bytes: int = 256 << 20,
        max_errors: int = 256,
        compile: Compile | None = None,
    ) -> None:
        self.vocabulary = vocabulary
        self.limits = limits
        self.max_bytes = max_bytes
        self.max_errors = max_errors
        self._compile = compile
        self._lock = threading.Lock()
        self._entries: OrderedDict[Key, Compiled] = OrderedDict()
        self._errors: OrderedDict[Key, Refusal] = OrderedDict()
        self._pending: dict[Key, _Pending] = {}
        self._hits = self._misses = self._evictions = 0
        self._compile_seconds = 0.0

    def get(self, kind: str, spec: str | Sequence[str], budget: Budget = UNBOUNDED) -> Compiled:
        """The compiled constraint (compiled now, within `budget`, if need be); raises InvalidInput,
        or Abandoned once `budget` is."""
        key: Key = (kind, spec if isinstance(spec, str) else tuple(spec))
        while True:  # again when the compile this caller waited for was abandoned
            pending, mine = self._claim(key)
            if not isinstance(pending, _Pending):
                return pending
            if mine:
                self._run(key, spec, pending, budget)
            found = _wait(pending, budget)
            if found is not None:
                return found

    def peek(self, kind: str, spec: str | Sequence[str]) -> Compiled | None:
        """The constraint if it is compiled already (None otherwise: nothing is started); raises
        its remembered InvalidInput. Cheap enough for an event loop."""
        key: Key = (kind, spec if isinstance(spec, str) else tuple(spec))
        with self._lock:
            return self._lookup(key)

    def _claim(self, key: Key) -> tuple[Compiled | _Pending, bool]:
        """The cached constraint, or the compile to wait for and whether this caller runs it."""
        with self._lock:
            found = self._lookup(key)
            if found is not None:
                return found, False
            pending = self._pending.get(key)
            if pending is not None:
                self._hits += 1
                return pending, False
            pending = self._pending[key] = _Pending()
            self._misses += 1
            return pending, True

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                self._hits,
                self._misses,
                self._compile_seconds,
                len(self._entries),
                self._nbytes(),
                self._evictions,
            )

    def _lookup(self, key: Key) -> Compiled | None:
        if key in self._errors:
            self._hits += 1
            raise self._errors[key].error()
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
            self._hits += 1
            self._trim()
        return found

    def _run(self, key: Key, spec: str | Sequence[str], pending: _Pending, budget: Budget) -> None:
        started = time.perf_counter()
        budget.start()
        try:
            pending.result = self._compile_now(key[0], spec, budget)
        except InvalidInput as exc:
            pending.error = exc
        except Abandoned:
            pending.abandoned = True  # not remembered: a caller still waiting compiles it again
        finally:
            with self._lock:
                self._compile_seconds += time.perf_counter() - started
                del self._pending[key]
                self._store(key, pending)
            pending.done.set()

    def _compile_now(self, kind: str, spec: str | Sequence[str], budget: Budget) -> Compiled:
        if self._compile is None:
            return compile_constraint(kind, spec, self.vocabulary, self.limits, budget)
        return self._compile(kind, spec, self.vocabulary, self.limits)  # a stand-in knows no budget

    def _store(self, key: Key, pending: _Pending) -> None:
        if pending.error is not None:
            self._errors[key] = Refusal.of(pending.error)
            while len(self._errors) > self.max_errors:
                self._errors.popitem(last=False)
        if pending.result is not None:
            self._entries[key] = pending.result
            self._trim()

    def _trim(self) -> None:
        total = self._nbytes()
        while total > self.max_bytes and len(self._entries) > 1:
            _, evicted = self._entries.popitem(last=False)
            total -= evicted.nbytes
            self._evictions += 1

    def _nbytes(self) -> int:
        return sum(c.nbytes for c in self._entries.values())


@dataclass(frozen=True)
class Refusal:
    """A refused compile as remembered: its message, reason and field, never the exception itself,
    whose traceback holds the failed compile's frames and automata (hundreds of MB apiece)."""

    message: str
    reason: str
    field: str

    @classmethod
    def of(cls, error: InvalidInput) -> Refusal:
        return cls(str(error), error.reason, error.field)

    def error(self) -> InvalidInput:
        """A fresh exception each time: raising a stored one would attach (and keep) a traceback."""
        return InvalidInput(self.message, reason=self.reason, field=self.field)


def _wait(pending: _Pending, budget: Budget) -> Compiled | None:
    """The compile's result (None: it was abandoned, compile again); Abandoned once `budget` is."""
    while not pending.done.wait(WAIT_CHECK_S):
        if budget.abandoned:
            raise Abandoned("the caller left while another's compile ran")
    if budget.abandoned:
        raise Abandoned("the caller left")
    if pending.error is not None:
        raise pending.error
    if pending.abandoned:
        return None
    assert pending.result is not None, "a compile ended without a result or an error"
    return pending.result
