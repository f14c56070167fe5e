"""The bounded cache of shape variants: everything prepared for one forward shape.

Keyed by the forward's shape, least-recently-used first out, sized by the
engine to hold every shape it plans (three ladder widths + the decode batch
widths). It counts hits, misses, evictions and
refusals and reports the bytes each variant holds, so the memory budget sees it.
A backend that cannot release a variant (CUDA graphs) admits only what it will
keep: a full cache then refuses, and the caller runs that shape eagerly.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar


@dataclass(frozen=True, order=True)
class VariantKey:
    """A forward shape: a prefill of `width` rows on one session's row (batch 0),
    or a decode forward of one row each over pool rows [0, batch), or (`prompts` > 0) a prefill of
    `width` rows for each of that many new prompts at once. On a graph that gathers the rows it
    reads before its head, `reads` query rows of each batch row reach the head (1: the last real
    row; the hook for the real rows of a prefill is `reads=width`; `prompts` of them for prompts:
    each prompt's last real row)."""

    width: int
    ports: tuple[str, ...] = ()
    batch: int = 0
    reads: int = 1
    prompts: int = 0


class Variant(Protocol):
    @property
    def nbytes(self) -> int: ...

    def release(self) -> None: ...


V = TypeVar("V", bound=Variant)


@dataclass(frozen=True)
class VariantEntry:
    key: VariantKey
    nbytes: int
    hits: int


@dataclass(frozen=True)
class VariantStats:
    entries: tuple[VariantEntry, ...]
    capacity: int
    hits: int
    misses: int
    prepared: int
    evictions: int
    refusals: int

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries)


class VariantCache(Generic[V]):
    def __init__(self, capacity: int, *, evictable: bool = True) -> None:
        self.capacity = max(capacity, 1)
        self.evictable = evictable
        self._items: OrderedDict[VariantKey, V] = OrderedDict()
        self._hits: dict[VariantKey, int] = {}
        self.hits = self.misses = self.prepared = self.evictions = self.refusals = 0

    def get(self, key: VariantKey, prepare: Callable[[VariantKey], V]) -> V | None:
        """The variant for `key`, prepared on a miss; None when a full, unevictable cache refuses."""
        found = self._items.get(key)
        if found is not None:
            self.hits += 1
            self._hits[key] += 1
            self._items.move_to_end(key)
            return found
        self.misses += 1
        if len(self._items) >= self.capacity:
            if not self.evictable:
                self.refusals += 1
                return None
            old_key, old = self._items.popitem(last=False)
            del self._hits[old_key]
            old.release()
            self.evictions += 1
        variant = prepare(key)
        self.prepared += 1
        self._items[key] = variant
        self._hits[key] = 0
        return variant

    def clear(self) -> None:
        for variant in self._items.values():
            variant.release()
        self._items.clear()
        self._hits.clear()

    def reset(self) -> None:
        """Release every variant and zero the counters: the cache as it was built."""
        self.clear()
        self.hits = self.misses = self.prepared = self.evictions = self.refusals = 0

    def stats(self) -> VariantStats:
        entries = tuple(VariantEntry(k, v.nbytes, self._hits[k]) for k, v in self._items.items())
        return VariantStats(
            entries, self.capacity, self.hits, self.misses, self.prepared, self.evictions, self.refusals
        )
