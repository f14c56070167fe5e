"""The core in process: the orders of service/core/orders.py answered with this process's scheduler,
sessions and constraints (issue #42). A frontend holds it as a `CoreApi`; a transport between
processes answers the same orders with one of these on the core's side."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing

from engine.executor.session import Session
from engine.executor.step import Stats
from engine.sampling import Sampler, SamplingParams
from service.calls import ConstraintSpec, Stopping, sampler_of
from service.core.counting import counted
from service.core.orders import (
    CloseOrder,
    CoreCall,
    DecodeOrder,
    ForkDone,
    ForkOrder,
    GenerateOrder,
    PrefillOrder,
    RewindOrder,
    StatsDone,
)
from service.core.serving import Extension, Serving
from service.core.sessions import ForkOrigin, SessionState
from service.events import PrefillFinished
from service.worker.cuts import Cuts
from service.worker.generation import (
    close_body,
    decode_body,
    fork_body,
    generate_body,
    peek_body,
    prefill_body,
    rewind_body,
)
from service.worker.jobs import Body, Event, Sink
from service.worker.min_tokens import ending_tokens, hold_ends


class PrefillSession:
    """A Prefill's session on the core, held for the call (another call on it is ABORTED): prompt
    parts appended one by one, the next token previewed, and the extension kept only when the
    frontend says so (`keep`: once "done" went through); else undone when the Prefill ends."""

    def __init__(self, serving: Serving, extension: Extension, sampling: SamplingParams) -> None:
        self._serving, self._extension, self._sampling = serving, extension, sampling
        self.kept = False

    @property
    def session_id(self) -> str:
        return self._extension.state.id

    def part(self, tokens: list[int]) -> AsyncGenerator[list[Event], None]:
        """Append one part: its events (ForwardDone per forward, Shared rows)."""
        serving, extension = self._serving, self._extension
        body = extension.marked(prefill_body(extension.state, tokens))
        return serving.scheduler.batches(counted(body, serving.metrics, serving.totals))

    async def peek(self) -> PrefillFinished:
        """The token the sampling picks next, not fed (PrefillDone's preview)."""
        result = await self._serving.scheduler.result(
            peek_body(self._extension.state, Sampler(self._sampling))
        )
        assert isinstance(result, PrefillFinished)
        return result

    def keep(self) -> None:
        self.kept = True


class Core:
    """The in-process core: orders answered with the server's scheduler, sessions and constraints."""

    def __init__(self, serving: Serving) -> None:
        self.serving = serving
        self._forks: dict[str, tuple[SessionState, str]] = {}  # answered, not yet taken or refused

    @contextlib.asynccontextmanager
    async def prefill(self, order: PrefillOrder) -> AsyncIterator[PrefillSession]:
        serving = self.serving
        extension = await serving.extension(order.session_id, order.caller)
        with serving.sessions.using(extension.state):
            session = PrefillSession(serving, extension, order.sampling)
            try:
                yield session
            finally:
                if not session.kept:
                    serving.undo(extension)

    async def rewind(self, order: RewindOrder) -> int:
        """Keep the session's first `length` tokens; its new length."""
        serving = self.serving
        state = serving.sessions.get(order.session_id, order.caller)
        with serving.sessions.using(state):
            length: int = await serving.scheduler.result(rewind_body(state, order.length))
        return length

    async def close(self, order: CloseOrder) -> int:
        """Close the session; the tokens it held."""
        serving = self.serving
        state = serving.sessions.get(order.session_id, order.caller)
        with serving.sessions.using(state):
            serving.sessions.remove(state)
            # Shielded: the slot returns even when the caller leaves before the worker has closed it.
            closing = asyncio.ensure_future(serving.scheduler.result(close_body(state, "closed")))
            length: int = await asyncio.shield(closing)
        return length

    async def fork(self, order: ForkOrder) -> ForkDone:
        sessions, caller = self.serving.sessions, order.caller
        named = sessions.fork_session_id(order.fork_id) if order.fork_id else ""
        if named and (made := sessions.made_fork(named, caller, order.session_id, order.length)) is not None:
            return _fork_done(made, order.session_id, 0.0, retry=True)
        if named:
            sessions.start_fork(named, caller)
        try:
            state, ms = await self._fork(order, named)
        except BaseException:
            sessions.end_fork(named, caller)
            raise
        self._forks[state.id] = (state, named)
        return _fork_done(state, order.session_id, ms)

    def fork_taken(self, done: ForkDone, taken: bool) -> None:
        """The frontend's word on a fork it answered: taken by its client, or not (closed). A retry
        of its name may be answered from now on."""
        state, named = self._forks.pop(done.session_id)
        if not taken:
            self.serving.close_soon(state, "fork_not_taken")
        self.serving.sessions.end_fork(named, state.owner)

    async def _fork(self, order: ForkOrder, session_id: str) -> tuple[SessionState, float]:
        """A new session of the caller's holding its session's first `order.length` tokens, named
        `session_id` ("": a random id), and the time the worker spent on it."""
        serving = self.serving
        source = serving.sessions.get(order.session_id, order.caller)
        spent: list[float] = []
        generated: list[int] = []  # the source's Decode-chosen positions the fork holds

        async def forking(caller: str) -> Session:
            forked = await serving.scheduler.result(fork_body(source, order.length))
            spent.append(forked.ms)
            generated.extend(p for p in source.generated if p < forked.session.length)
            session: Session = forked.session
            return session

        with serving.sessions.using(source):
            state = await serving.claim(forking, order.caller, session_id)
        state.generated = generated
        if session_id:
            state.fork_of = ForkOrigin(source.id, order.length, state.session.length)
        return state, spent[0]

    async def stats(self) -> StatsDone:
        serving = self.serving
        stats = await serving.scheduler.run(Stats())
        serving.metrics.engine_stats(stats)
        scheduler = serving.scheduler
        parking = serving.model.session_memory > 0
        return StatsDone(stats, scheduler.depth, scheduler.waiting, serving.totals, parking)

    def generate(self, order: GenerateOrder, sink: Sink | None = None) -> CoreCall:
        """The order's events in lists; with a `sink` (the core's link) they go to it as the worker
        hands them over, and the call's `events` only end (service/worker/jobs.put_all)."""
        cuts = Cuts(self.serving.scheduler.wake)
        return CoreCall(self._generate(order, cuts if order.watching else None, sink), cuts)

    def decode(self, order: DecodeOrder, sink: Sink | None = None) -> CoreCall:
        """As `generate`, one Decode's."""
        cuts = Cuts(self.serving.scheduler.wake)
        return CoreCall(self._decode(order, cuts if order.watching else None, sink), cuts)

    async def _generate(
        self, order: GenerateOrder, cuts: Cuts | None, sink: Sink | None
    ) -> AsyncGenerator[list[Event], None]:
        serving = self.serving
        width = serving.sample_width(order.n, order.caller)
        samplers = [sampler_of(order.sampling.for_sample(i), order.logprobs) for i in range(order.n)]
        await self._prepare(samplers, order.stopping, order.constraint)
        body = generate_body(
            serving.model,
            list(order.tokens),
            samplers,
            order.stopping,
            serving.scope(order.caller),
            order.prompt_top,
            order.speculate,
            width,
            cuts,
        )
        hold = order.unary and cuts is None  # a stop string found ends the job early: events must come
        try:
            async with aclosing(self._run(body, hold, None if hold else sink)) as batches:
                async for events in batches:
                    yield events
        finally:
            self._constraint_time(samplers)

    async def _decode(
        self, order: DecodeOrder, cuts: Cuts | None, sink: Sink | None
    ) -> AsyncGenerator[list[Event], None]:
        serving = self.serving
        state = serving.sessions.get(order.session_id, order.caller)
        sampler = sampler_of(order.sampling, order.logprobs)
        await self._prepare([sampler], order.stopping, order.constraint)
        try:
            # Released before the frontend hears the end, so its next call on the session is never ABORTED.
            with serving.sessions.using(state):
                body = decode_body(serving.model, state, sampler, order.stopping, order.speculate, cuts)
                async with aclosing(self._run(body, False, sink)) as batches:
                    async for events in batches:
                        yield events
        finally:
            self._constraint_time([sampler])

    def _run(self, body: Body, hold: bool, sink: Sink | None = None) -> AsyncGenerator[list[Event], None]:
        serving = self.serving
        return serving.scheduler.batches(counted(body, serving.metrics, serving.totals), hold=hold, sink=sink)

    async def _prepare(
        self, samplers: list[Sampler], stopping: Stopping, constraint: ConstraintSpec | None
    ) -> None:
        """Each sampler with its own state of the constraint (compiled off the event loop and the
        worker, before the call asks for a KV slot), and min_new_tokens: the tokens that would end a
        sample masked out of its first choices."""
        serving = self.serving
        rows = await serving.constraints.rows(constraint, len(samplers))
        for sampler, row in zip(samplers, rows, strict=True):
            sampler.constraint = row
        ends = ending_tokens(serving.model.eos_ids, stopping, constraint is not None)
        hold_ends(samplers, stopping.min_new_tokens, ends, serving.model.vocab_size)

    def _constraint_time(self, samplers: list[Sampler]) -> None:
        """The time the samplers' constraints took per token, into the metric."""
        for sampler in samplers:
            tokens = sampler.counts.total()
            if sampler.constraint is not None and tokens:
                self.serving.metrics.constraint_mask.observe(sampler.constraint_seconds / tokens)


def _fork_done(state: SessionState, source_id: str, ms: float, retry: bool = False) -> ForkDone:
    """A fork's answer; a retry's is its first call's (the length the fork was made with)."""
    length = state.fork_of.length if state.fork_of is not None else state.session.length
    return ForkDone(state.id, length, source_id, ms, retry)
