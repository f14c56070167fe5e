"""The seed's cache experiment, and the cache's own bookkeeping."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from engine.runtime.variants import VariantCache, VariantKey
from tests.support.engines import greedy, load
from tests.support.prompts import prompt_ids

# Remainders at chunk 64: 37, 26, 12, 8, 59 -> five distinct unpadded widths.
SEED_LENGTHS = (37, 90, 140, 200, 251)
# The seed's cache: room for the three ladder widths and one decode shape.
SEED_CAPACITY = 4


def _two_passes(engine) -> list[tuple[int, int, int]]:
    """Run each length twice; after each request record (prepared, evictions, entries)."""
    trace = []
    for _ in range(2):
        for length in SEED_LENGTHS:
            session = engine.open_session()
            greedy(engine, session, 4, prompt_ids(length, seed=length))
            engine.close_session(session)
            stats = engine.stats().variants
            trace.append((stats.prepared, stats.evictions, len(stats.entries)))
    return trace


def test_with_padding_the_second_pass_prepares_no_new_variant(model_dir) -> None:
    engine = load(model_dir(), padding=True, variant_capacity=SEED_CAPACITY)
    trace = _two_passes(engine)
    first_pass_prepared = trace[len(SEED_LENGTHS) - 1][0]
    assert trace[-1][0] == first_pass_prepared
    assert all(entries <= SEED_CAPACITY for _, _, entries in trace)
    assert trace[-1][1] == 0
    keys = {e.key for e in engine.stats().variants.entries}
    assert keys <= {VariantKey(w) for w in engine.ladder} | {VariantKey(1, (), 1)}


def test_without_padding_distinct_widths_grow_and_the_cache_thrashes(model_dir) -> None:
    engine = load(model_dir(), padding=False, variant_capacity=SEED_CAPACITY)
    trace = _two_passes(engine)
    first_pass = trace[len(SEED_LENGTHS) - 1]
    assert trace[-1][0] > first_pass[0], "the second pass prepares variants again"
    assert trace[-1][1] > first_pass[1] > 0, "evictions keep climbing"
    assert all(entries <= SEED_CAPACITY for _, _, entries in trace)


@pytest.mark.parametrize("variant", ["plain", "recurrent"])
def test_the_default_cache_holds_every_ladder_width_and_every_decode_shape(model_dir, variant) -> None:
    engine = load(model_dir(variant), max_sessions=6)
    decode_shapes = len(engine.batch_widths) or 1  # unbatched: one single-row prefill shape
    assert engine.variants.capacity == len(engine.ladder) + decode_shapes
    assert engine.batch_widths == (() if variant == "recurrent" else (1, 2, 4, 6))


def test_with_padding_and_the_default_cache_no_pass_ever_evicts(model_dir) -> None:
    engine = load(model_dir(), padding=True)
    trace = _two_passes(engine)
    assert trace[-1][0] == trace[len(SEED_LENGTHS) - 1][0] == len(engine.ladder) + 1
    assert all(evictions == 0 for _, evictions, _ in trace)


@dataclass
class _Fake:
    nbytes: int
    released: bool = False

    def release(self) -> None:
        self.released = True


def test_the_cache_evicts_the_least_recently_used_variant_and_counts_it() -> None:
    cache: VariantCache[_Fake] = VariantCache(2)
    made: dict[int, _Fake] = {}

    def prepare(key: VariantKey) -> _Fake:
        made[key.width] = _Fake(key.width * 10)
        return made[key.width]

    cache.get(VariantKey(1), prepare)
    cache.get(VariantKey(2), prepare)
    cache.get(VariantKey(1), prepare)
    cache.get(VariantKey(3), prepare)
    stats = cache.stats()
    assert [e.key.width for e in stats.entries] == [1, 3]
    assert made[2].released
    assert (stats.hits, stats.misses, stats.evictions, stats.prepared) == (1, 3, 1, 3)
    assert stats.nbytes == 40


def test_an_unevictable_cache_refuses_instead_of_evicting() -> None:
    cache: VariantCache[_Fake] = VariantCache(1, evictable=False)
    assert cache.get(VariantKey(1), lambda k: _Fake(1)) is not None
    assert cache.get(VariantKey(2), lambda k: _Fake(2)) is None
    assert cache.stats().refusals == 1 and len(cache.stats().entries) == 1


def test_each_variant_reports_the_bytes_of_its_buffers(model_dir) -> None:
    engine = load(model_dir())
    engine.append(engine.open_session(), prompt_ids(30))
    (entry,) = engine.stats().variants.entries
    # input ids [1, 44] int64 + the row read [1] and the rows seen [2] int64 + logits [1, 1, 512] float32
    assert entry.nbytes == 44 * 8 + 3 * 8 + 1 * 512 * 4
