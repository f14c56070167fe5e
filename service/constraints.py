"""Structured output for the served model: constraints compiled once, off the event loop and off the
engine worker, and one row state per sample.

The vocabulary as bytes is built from the tokenizer when the first constraint arrives (a model
without a tokenizer Ladder can read has no text to constrain: FAILED_PRECONDITION, as for text
prompts). A constraint is compiled on a worker thread of the event loop's executor, and its first
state's allowed tokens are computed there too; then one thread of its own computes the masks of
every other state of an automaton (~0.4 ms each on a 49k vocabulary), so the engine worker
looks masks up instead of computing them (a row that reaches a state first computes it). A
request waits for its constraint before it asks for a KV slot. Metrics: constrained requests by
kind, compile seconds, cache hits and misses, and mask seconds per constrained token.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from engine.constrain.cache import ConstraintCache
from engine.constrain.compiled import Compiled, RowState
from engine.constrain.vocabulary import Vocabulary
from engine.executor.facts import EngineFacts
from service.calls import ConstraintSpec
from service.errors import NoTokenizer


class Constraints:
    def __init__(self, tokenizer: Any | None, facts: EngineFacts, max_bytes: int,
                 metrics: Any = None) -> None:
        self._tokenizer = tokenizer
        self._facts = facts
        self._max_bytes = max_bytes
        self._metrics = metrics
        self._cache: ConstraintCache | None = None
        self._lock = threading.Lock()
        self._warming = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ladder-masks")
        self._warmed: weakref.WeakSet[Any] = weakref.WeakSet()
        self.stopping = threading.Event()

    def cache(self) -> ConstraintCache:
        """The cache, with the vocabulary as bytes made on first use (~40 ms for 49k tokens)."""
        with self._lock:
            if self._cache is None:
                if self._tokenizer is None:
                    raise NoTokenizer("structured output needs the model's tokenizer (the text of each "
                                      "token) and this model has none Ladder can read")
                vocabulary = Vocabulary.from_tokenizer(self._tokenizer, self._facts.vocab_size,
                                                       self._facts.eos_ids)
                self._cache = ConstraintCache(vocabulary, max_bytes=self._max_bytes)
            return self._cache

    def compile(self, spec: ConstraintSpec) -> Compiled:
        """The compiled constraint with its first state's mask computed (on the calling thread)."""
        cache = self.cache()
        before = cache.stats()
        started = time.perf_counter()
        compiled = cache.get(spec.kind, spec.spec)
        compiled.start().allowed()
        warm = getattr(compiled, "warm", None)
        with self._lock:
            fresh = warm is not None and compiled not in self._warmed
            if fresh:
                self._warmed.add(compiled)
        if warm is not None and fresh:
            self._warming.submit(warm, self.stopping)
        if self._metrics is not None:
            hit = cache.stats().hits > before.hits
            self._metrics.constraint_compiled(spec.kind, time.perf_counter() - started, hit)
        return compiled

    async def rows(self, spec: ConstraintSpec | None, n: int) -> list[RowState | None]:
        """One fresh constraint state per sample (None each when the request has no constraint)."""
        if spec is None:
            return [None] * n
        if self._metrics is not None:
            self._metrics.constrained_requests.labels(spec.kind).inc()
        compiled = await asyncio.to_thread(self.compile, spec)
        return [compiled.start() for _ in range(n)]

    def close(self) -> None:
        """Stop computing masks ahead (the server is stopping)."""
        self.stopping.set()
        self._warming.shutdown(wait=False, cancel_futures=True)

    def stats(self) -> Any:
        return None if self._cache is None else self._cache.stats()
