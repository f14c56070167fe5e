"""The core's side of a generation, behind typed orders (issue #42: the cut at the token level).

A frontend (the gRPC servicer and the HTTP app) turns a call into an order: token ids, sampling,
stopping by ids and budgets, n, log-probabilities, the constraint, the caller. The core checks
the caller's share of the KV slots, compiles the constraint, runs the job on the engine worker
and streams its events back: token ids (no text), finish reasons, prefill forwards and rows
shared (service/events.py). Text, stop strings, protobuf and HTTP are the frontend's: it judges
each token's text and tells the core (`CoreCall.verdicts`: a stop string found cuts the sample;
a kept session waits for the verdicts, service/texts.py).

Orders and events are frozen values that pickle as they are, so a transport between processes
carries them unchanged (`VERSION` is what its two ends agree on); in process, as now, `Core`
answers them on the server's own event loop, and every test runs this path.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass

from engine.sampling import Sampler, SamplingParams
from service.calls import ConstraintSpec, LogprobRequest, Stopping, sampler_of
from service.generation import decode_body, generate_body
from service.jobs import Body, Event
from service.min_tokens import ending_tokens, hold_ends
from service.progress import counted
from service.serving import Serving, note_session
from service.texts import Cuts

VERSION = 1  # of the orders and events below: a transport's two ends must agree on it


@dataclass(frozen=True)
class GenerateOrder:
    """Generate n samples of a prompt given as token ids. `stopping` is budgeted already (the
    frontend knows the capacity); its stop strings are the frontend's to find (`watching`)."""

    tokens: tuple[int, ...]
    sampling: SamplingParams
    stopping: Stopping
    n: int = 1
    logprobs: LogprobRequest | None = None
    constraint: ConstraintSpec | None = None
    speculate: bool = True
    caller: str = ""
    watching: bool = False  # the frontend looks for stop strings: its verdicts may cut samples
    unary: bool = False  # the frontend answers once, at the end: events may wait for it

    @property
    def prompt_top(self) -> int | None:
        """Alternatives per prompt token when the prompt's log-probabilities are asked for, else None."""
        return self.logprobs.top if self.logprobs is not None and self.logprobs.prompt else None


@dataclass(frozen=True)
class DecodeOrder:
    """Continue a session. `stopping` is budgeted on the worker, against the session's length."""

    session_id: str
    sampling: SamplingParams
    stopping: Stopping
    logprobs: LogprobRequest | None = None
    constraint: ConstraintSpec | None = None
    speculate: bool = True
    caller: str = ""
    watching: bool = False


class CoreCall:
    """One order in flight: its events in lists (`events`), and where the frontend's verdicts on
    the tokens' text go (`verdicts`; ignored unless the order was `watching`)."""

    def __init__(self, events: AsyncGenerator[list[Event], None], verdicts: Cuts) -> None:
        self.events = events
        self.verdicts = verdicts


class Core:
    """The in-process core: orders answered with the server's scheduler, sessions and constraints."""

    def __init__(self, serving: Serving) -> None:
        self.serving = serving

    def generate(self, order: GenerateOrder) -> CoreCall:
        cuts = Cuts(self.serving.scheduler.wake)
        return CoreCall(self._generate(order, cuts if order.watching else None), cuts)

    def decode(self, order: DecodeOrder) -> CoreCall:
        cuts = Cuts(self.serving.scheduler.wake)
        return CoreCall(self._decode(order, cuts if order.watching else None), cuts)

    async def _generate(self, order: GenerateOrder, cuts: Cuts | None) -> AsyncGenerator[list[Event], None]:
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
            async with aclosing(self._run(body, hold)) as batches:
                async for events in batches:
                    yield events
        finally:
            self._constraint_time(samplers)

    async def _decode(self, order: DecodeOrder, cuts: Cuts | None) -> AsyncGenerator[list[Event], None]:
        serving = self.serving
        state = note_session(serving.sessions.get(order.session_id, order.caller))
        sampler = sampler_of(order.sampling, order.logprobs)
        await self._prepare([sampler], order.stopping, order.constraint)
        try:
            # Released before the frontend hears the end, so its next call on the session is never ABORTED.
            with serving.sessions.using(state):
                body = decode_body(serving.model, state, sampler, order.stopping, order.speculate, cuts)
                async with aclosing(self._run(body, False)) as batches:
                    async for events in batches:
                        yield events
        finally:
            self._constraint_time([sampler])

    def _run(self, body: Body, hold: bool) -> AsyncGenerator[list[Event], None]:
        serving = self.serving
        return serving.scheduler.batches(counted(body, serving.metrics, serving.totals), hold=hold)

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
