"""A refused constraint leaves nothing of its compile behind: the cache remembers why it was refused
(message, reason, field), never the exception, whose traceback holds the failed compile's frames and
automata (issue #46: distinct refused regexes grew a server by gigabytes that idle never gave back)."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from engine.constrain import ConstraintCache, Limits, Vocabulary
from engine.errors import InvalidInput

VOCAB = Vocabulary([bytes([i]) for i in range(256)], 257, [256])
REFUSED = 10


def refuse(cache: ConstraintCache, spec: str) -> InvalidInput:
    with pytest.raises(InvalidInput) as refused:
        cache.get("regex", spec)
    return refused.value


def test_refused_compiles_keep_no_memory_once_their_callers_are_answered() -> None:
    cache = ConstraintCache(VOCAB, limits=Limits(max_states=300))
    refuse(cache, ".{500}x")  # the compiler's own first-use allocations, out of the measure
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for k in range(REFUSED):
            refuse(cache, f".{{500}}x{k}")
        gc.collect()
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # Each refused compile held ~4 MB while it was remembered as its exception; now a few hundred bytes.
    assert retained < 256 * 1024, f"{retained} bytes kept by {REFUSED} refused compiles"


def test_a_remembered_refusal_answers_as_the_first_did_without_compiling() -> None:
    cache = ConstraintCache(VOCAB, limits=Limits(max_states=300))
    first = refuse(cache, ".{500}y")
    misses = cache.stats().misses
    again = refuse(cache, ".{500}y")
    assert (str(again), again.reason, again.field) == (str(first), first.reason, first.field)
    assert again is not first and again.__traceback__ is not None and cache.stats().misses == misses
