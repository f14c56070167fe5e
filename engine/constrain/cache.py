"""Compiled constraints kept by (kind, spec): a thread-safe LRU under a byte budget.

Compiles run on a thread pool: a second request for a key being compiled waits for that
compile instead of starting its own; a spec that failed fails again from a small memory of
errors without compiling. The budget counts each constraint's table and the masks it has cached
so far (they grow as rows reach new states); the least recently used go first, never the one
just asked for. Rows of an evicted constraint keep working: they hold it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine.constrain.compiled import Compiled, compile_constraint
from engine.constrain.limits import DEFAULT_LIMITS, Limits
from engine.constrain.vocabulary import Vocabulary
from engine.errors import InvalidInput

Key = tuple[str, str | tuple[str, ...]]
Compile = Callable[[str, "str | Sequence[str]", Vocabulary, Limits], Compiled]


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


class ConstraintCache:
    def __init__(self, vocabulary: Vocabulary, limits: Limits = DEFAULT_LIMITS, max_bytes: int = 256 << 20,
                 max_errors: int = 256, compile: Compile = compile_constraint) -> None:
        self.vocabulary = vocabulary
        self.limits = limits
        self.max_bytes = max_bytes
        self.max_errors = max_errors
        self._compile = compile
        self._lock = threading.Lock()
        self._entries: OrderedDict[Key, Compiled] = OrderedDict()
        self._errors: OrderedDict[Key, InvalidInput] = OrderedDict()
        self._pending: dict[Key, _Pending] = {}
        self._hits = self._misses = self._evictions = 0
        self._compile_seconds = 0.0

    def get(self, kind: str, spec: str | Sequence[str]) -> Compiled:
        """The compiled constraint (compiled now if need be); raises InvalidInput."""
        key: Key = (kind, spec if isinstance(spec, str) else tuple(spec))
        with self._lock:
            found = self._lookup(key)
            if found is not None:
                return found
            pending = self._pending.get(key)
            mine = pending is None
            if pending is None:
                pending = self._pending[key] = _Pending()
                self._misses += 1
            else:
                self._hits += 1
        if not mine:
            return _wait(pending)
        self._run(key, spec, pending)
        return _wait(pending)

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._hits, self._misses, self._compile_seconds, len(self._entries),
                              self._nbytes(), self._evictions)

    def _lookup(self, key: Key) -> Compiled | None:
        if key in self._errors:
            self._hits += 1
            raise self._errors[key]
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
            self._hits += 1
            self._trim()
        return found

    def _run(self, key: Key, spec: str | Sequence[str], pending: _Pending) -> None:
        started = time.perf_counter()
        try:
            pending.result = self._compile(key[0], spec, self.vocabulary, self.limits)
        except InvalidInput as exc:
            pending.error = exc
        finally:
            with self._lock:
                self._compile_seconds += time.perf_counter() - started
                del self._pending[key]
                self._store(key, pending)
            pending.done.set()

    def _store(self, key: Key, pending: _Pending) -> None:
        if pending.error is not None:
            self._errors[key] = pending.error
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


def _wait(pending: _Pending) -> Compiled:
    pending.done.wait()
    if pending.error is not None:
        raise pending.error
    assert pending.result is not None, "a compile ended without a result or an error"
    return pending.result
