"""Structured output for the served model: constraints compiled once, off the event loop and off the
engine worker, and one row state per sample.

The vocabulary as bytes is built from the tokenizer when the first constraint arrives (a model
without a tokenizer Ladder can read has no text to constrain: FAILED_PRECONDITION, as for text
prompts). A constraint is compiled on one of COMPILE_WORKERS threads of its own (never the event
loop's executor, which tokenization and request parsing need), within --constraint-compile-seconds
of that thread's CPU time (more: CONSTRAINT_TOO_LARGE), and its first state's allowed tokens are
computed there too; a request whose caller leaves abandons its compile (a queued one never starts,
a running one stops at its next check). More than QUEUED_COMPILES waiting: RESOURCE_EXHAUSTED.
Then one thread of its own computes the masks of every other state of an automaton (~0.4 ms each
on a 49k vocabulary), so the engine worker looks masks up instead of computing them (a row that
reaches a state first computes it). A request waits for its constraint before it asks for a KV
slot. Metrics: constrained requests by kind, compile seconds, cache hits and misses, and mask
seconds per constrained token.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from engine.constrain.budget import Budget
from engine.constrain.cache import ConstraintCache
from engine.constrain.compiled import JSON_SCHEMA_STRICT, Compiled, RowState
from engine.constrain.vocabulary import Vocabulary
from engine.errors import Exhausted
from engine.executor.facts import EngineFacts
from service.calls import ConstraintSpec
from service.errors import NoTokenizer

COMPILE_WORKERS = 2  # compiles at once: pure Python, so more would only share the GIL
QUEUED_COMPILES = 16  # compiles waiting for a worker beyond those running; more: RESOURCE_EXHAUSTED


class Constraints:
    def __init__(
        self,
        tokenizer: Any | None,
        facts: EngineFacts,
        max_bytes: int,
        metrics: Any = None,
        compile_seconds: float | None = 2.0,
        strict: bool = False,
    ) -> None:
        self._tokenizer = tokenizer
        self._facts = facts
        self._max_bytes = max_bytes
        self._metrics = metrics
        self.compile_seconds = compile_seconds
        self.strict = strict  # a JSON schema's reading where the request does not say
        self._cache: ConstraintCache | None = None
        self._lock = threading.Lock()
        self._compiling = ThreadPoolExecutor(max_workers=COMPILE_WORKERS, thread_name_prefix="ladder-compile")
        self._waiting = 0  # compiles queued or running for callers still there (event loop only)
        self._running = 0  # compiles running on a compile thread now
        self._budgets: set[Budget] = set()  # of the compiles not finished: close() abandons them
        self._warming = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ladder-masks")
        self._warmed: weakref.WeakSet[Any] = weakref.WeakSet()
        self.stopping = threading.Event()

    @property
    def running(self) -> int:
        """Compiles running on a compile thread now (an abandoned one until its next check)."""
        return self._running

    def cache(self) -> ConstraintCache:
        """The cache, with the vocabulary as bytes made on first use (~40 ms for 49k tokens)."""
        with self._lock:
            if self._cache is None:
                if self._tokenizer is None:
                    raise NoTokenizer(
                        "structured output needs the model's tokenizer (the text of each "
                        "token) and this model has none Ladder can read"
                    )
                vocabulary = Vocabulary.from_tokenizer(
                    self._tokenizer, self._facts.vocab_size, self._facts.eos_ids
                )
                self._cache = ConstraintCache(vocabulary, max_bytes=self._max_bytes)
            return self._cache

    def compile(self, spec: ConstraintSpec, budget: Budget | None = None) -> Compiled:
        """The compiled constraint with its first state's mask computed (on the calling thread),
        within `budget`; InvalidInput past it, Abandoned once it is abandoned."""
        with self._lock:
            self._running += 1
        try:
            return self._compile(spec, budget or Budget(self.compile_seconds))
        finally:
            with self._lock:
                self._running -= 1

    def _compile(self, spec: ConstraintSpec, budget: Budget) -> Compiled:
        cache = self.cache()
        before = cache.stats()
        started = time.perf_counter()
        compiled = cache.get(self._kind(spec), spec.spec, budget)
        budget.check()  # the first mask: one vectorized walk of the vocabulary
        compiled.start().allowed()
        with self._lock:
            fresh = compiled not in self._warmed
            if fresh:
                self._warmed.add(compiled)
        if fresh:
            self._warming.submit(compiled.warm, self.stopping)
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
        compiled = await self._compiled(spec)
        return [compiled.start() for _ in range(n)]

    async def _compiled(self, spec: ConstraintSpec) -> Compiled:
        """`spec` compiled on a compile thread, abandoned if the caller leaves first (one compiled
        already is found at once, ahead of any compile queued)."""
        found = self._peek(spec)
        if found is not None:
            return found
        if self._waiting >= COMPILE_WORKERS + QUEUED_COMPILES:
            raise Exhausted(
                f"{self._waiting} structured-output constraints are compiling or waiting to; retry later",
                reason="CONSTRAINT_COMPILES_FULL",
            )
        budget = Budget(self.compile_seconds)
        self._budgets.add(budget)
        self._waiting += 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._compiling, self.compile, spec, budget)
        except asyncio.CancelledError:
            budget.abandon()  # a queued compile is cancelled with the future; a running one stops soon
            raise
        finally:
            self._waiting -= 1
            self._budgets.discard(budget)

    def _peek(self, spec: ConstraintSpec) -> Compiled | None:
        if self._cache is None:
            return None
        started = time.perf_counter()
        found = self._cache.peek(self._kind(spec), spec.spec)
        if found is not None and self._metrics is not None:
            self._metrics.constraint_compiled(spec.kind, time.perf_counter() - started, True)
        return found

    def _kind(self, spec: ConstraintSpec) -> str:
        """The engine's kind: a JSON schema read strictly is one of its own (cached apart)."""
        strict = self.strict if spec.strict is None else spec.strict
        return JSON_SCHEMA_STRICT if spec.kind == "json_schema" and strict else spec.kind

    def close(self) -> None:
        """Stop compiling and computing masks ahead (the server is stopping)."""
        self.stopping.set()
        for budget in list(self._budgets):
            budget.abandon()
        self._compiling.shutdown(wait=False, cancel_futures=True)
        self._warming.shutdown(wait=False, cancel_futures=True)

    def stats(self) -> Any:
        return None if self._cache is None else self._cache.stats()
