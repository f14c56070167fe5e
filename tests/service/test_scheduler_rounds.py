"""The scheduler's rounds against a recording engine: no model, milliseconds per test.

The fake engine answers each `Step` as the real one would in shape (sessions, prefill progress,
tokens) and records every step, so the tests state what a round asks of the engine: one step per
round, slots in arrival order, the prefill plan's spans, first tokens in one batched choice,
failures that stay with their job, and sessions lent to a job returning when it ends.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from engine.errors import Exhausted, InvalidInput
from engine.executor.prefill import ForwardReport
from engine.executor.session import Session
from engine.executor.step import (
    Choose,
    Close,
    DecodeRow,
    Fork,
    Open,
    Outcome,
    PrefillProgress,
    Rewind,
    Stats,
    Step,
    StepResult,
)
from engine.planner import Forward
from engine.sampling import Sampler, SamplingParams
from service.calls import Stopping
from service.core.sessions import SessionState
from service.events import Finished, TokenOut
from service.worker.generation import decode_steps, generate_body, prefill_body
from service.worker.jobs import Result
from service.worker.rounds import MAX_PREFILLS_PER_ROUND, Call, Lend, Token
from service.worker.scheduler import Scheduler

CHUNK = 8  # tokens one fake prefill forward takes
SHARED_SPAN = 3


@dataclass
class FakeTask:
    session: Session
    left: int
    logprobs: list[Any] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.left == 0


class RecordingEngine:
    """Sessions on `slots` rows; a prefill forward takes CHUNK tokens (or the span); a token is its
    session's length; every step and every batched choice is recorded."""

    def __init__(
        self, slots: int = 4, fail_rows: frozenset[int] = frozenset(), prompt_batch: int = 1
    ) -> None:
        self.rows = slots
        self.facts = SimpleNamespace(prompt_batch=prompt_batch)
        self.free = set(range(slots))
        self.open: dict[int, Session] = {}
        self.steps: list[Step] = []
        self.choices: list[int] = []  # rows chosen in each batched choice
        self.shared_span = SHARED_SPAN
        self.fail_rows = fail_rows
        self.lock = threading.Lock()
        self.on_step: Callable[[Step], None] | None = None  # runs on the worker before each step
        self.before: Callable[[], None] | None = None  # the scheduler's hook, run before a "forward"

    def before_forward(self, hook: Callable[[], None] | None) -> None:
        self.before = hook

    @property
    def free_slots(self) -> int:
        return len(self.free)

    def _new(self) -> Session:
        if not self.free:
            raise Exhausted("no slot")
        row = min(self.free)
        self.free.discard(row)
        session = self.open[row] = Session(row)
        return session

    def step(self, step: Step) -> StepResult:
        if self.before is not None and (step.prefills or step.decode):  # as a forward starts
            self.before()
        if self.on_step is not None:
            self.on_step(step)
        with self.lock:
            self.steps.append(step)
        ops = tuple(self._op(op) for op in step.ops)
        opens = []
        for request in step.opens:
            if request.count > len(self.free):
                opens.append(Outcome(error=Exhausted("no slots")))
            else:
                opens.append(Outcome([self._new() for _ in range(request.count)]))
        prefills, chosen = [], []
        for request, span in step.prefills:
            task = request.task or FakeTask(request.session, len(request.tokens))
            rows = min(task.left, span or CHUNK)
            past = request.session.length
            task.left -= rows
            request.session.length += rows
            request.session.has_logits = True
            report = ForwardReport(Forward(0, rows, rows, past), rows, request.session.length)
            tokens: tuple[int, ...] = ()
            if task.done and request.samplers:
                sessions = [request.session, *request.copies]
                for copy in request.copies:
                    copy.length, copy.has_logits = request.session.length, True
                tokens = tuple(s.length for s in sessions)
                chosen.extend(s.row for s in sessions)
            prefills.append(Outcome(PrefillProgress(task, report, 0, tokens)))  # type: ignore[arg-type]
        ops = tuple(
            Outcome(op.session.length) if isinstance(op, Choose) and out.error is None else out
            for op, out in zip(step.ops, ops, strict=True)
        )
        chosen.extend(op.session.row for op in step.ops if isinstance(op, Choose))
        if chosen:
            self.choices.append(len(chosen))
        decode = []
        for row in step.decode:
            if row.session.row in self.fail_rows:
                decode.append(Outcome(error=InvalidInput(f"row {row.session.row} fails")))
                continue
            row.session.length += 1
            decode.append(Outcome(row.session.length if row.sampler is not None else None))
        return StepResult(
            opens=tuple(opens),
            ops=ops,
            op_seconds=(0.001,) * len(ops),
            prefills=tuple(prefills),
            decode=tuple(decode),
            batch=len(step.decode),
            prefill_seconds=(0.0,) * len(prefills),
            choices=int(bool(chosen)),
        )

    def _op(self, op: Any) -> Outcome:
        if isinstance(op, Close):
            length = op.session.length
            if not op.session.closed:
                op.session.closed = True
                del self.open[op.session.row]
                self.free.add(op.session.row)
            return Outcome(length)
        if isinstance(op, Fork):
            if not self.free:
                return Outcome(error=Exhausted("no slot"))
            session = self._new()
            session.length = op.source.length if op.length is None else op.length
            return Outcome(session)
        if isinstance(op, Rewind):
            op.session.length = op.length
            return Outcome(op.length)
        if isinstance(op, Stats):
            return Outcome("stats")
        return Outcome()  # Choose: filled in by the batched choice


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


async def collect(scheduler: Scheduler, body: Generator[Any, Any, None], hold: bool = True) -> list[Any]:
    return [event async for event in scheduler.stream(body, hold=hold)]


def run(
    loop: asyncio.AbstractEventLoop,
    scheduler: Scheduler,
    *bodies: Generator[Any, Any, None],
    hold: bool = True,
) -> list[list[Any]]:
    """Submit every body in one go (so they meet in the same rounds) and collect their events."""

    async def together() -> list[list[Any]]:
        return list(await asyncio.gather(*(collect(scheduler, b, hold) for b in bodies)))

    return loop.run_until_complete(together())


@contextmanager
def held_worker(loop: asyncio.AbstractEventLoop, scheduler: Scheduler) -> Iterator[None]:
    """Hold the scheduler's worker inside a call until the block ends: jobs submitted meanwhile
    meet in its next round, however slowly they arrive (a loaded CI machine split them)."""
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        inside.set()
        release.wait(10)

    def body() -> Iterator[Any]:
        yield Call(hold)

    holder = asyncio.ensure_future(collect(scheduler, body()), loop=loop)  # type: ignore[arg-type]
    loop.run_until_complete(asyncio.to_thread(inside.wait, 10))
    try:
        yield
    finally:
        release.set()
        loop.run_until_complete(holder)


def model(capacity: int = 1000) -> Any:
    return SimpleNamespace(tokenizer=None, capacity=capacity, eos_ids=frozenset(), draft_tokens=0)


@pytest.fixture
def engine() -> RecordingEngine:
    return RecordingEngine()


@pytest.fixture
def scheduler(engine: RecordingEngine) -> Iterator[Scheduler]:
    scheduler = Scheduler(engine, max_queue=64)  # type: ignore[arg-type]
    yield scheduler
    scheduler.stop()


def generate(tokens: int, new: int, n: int = 1) -> Generator[Any, Any, None]:
    samplers = [Sampler(SamplingParams()) for _ in range(n)]
    return generate_body(model(), list(range(1, tokens + 1)), samplers, Stopping(new))


def test_a_generate_runs_open_prefill_and_decode_as_steps_and_returns_its_slot(
    loop: asyncio.AbstractEventLoop, scheduler: Scheduler, engine: RecordingEngine
) -> None:
    [events] = run(loop, scheduler, generate(tokens=20, new=3))
    tokens = [e.id for e in events if isinstance(e, TokenOut)]
    assert tokens == [20, 21, 22]  # the fake's token is the session's length when chosen
    assert [len(s.opens) for s in engine.steps][:1] == [1]
    assert [len(s.prefills) for s in engine.steps if s.prefills] == [1, 1, 1]  # 8 + 8 + 4 rows
    assert isinstance(events[-1], Finished)
    assert engine.free_slots == 4


def test_the_first_tokens_of_a_sixteen_stream_round_are_chosen_in_one_batched_choice(
    loop: asyncio.AbstractEventLoop,
) -> None:
    engine = RecordingEngine(slots=16)
    sessions = [engine._new() for _ in range(16)]
    for session in sessions:
        session.length, session.has_logits = 5, True
    scheduler = Scheduler(engine, max_queue=64)  # type: ignore[arg-type]
    try:
        bodies = [
            decode_steps(model(), s, Sampler(SamplingParams()), Stopping(2), feed_last=False)
            for s in sessions
        ]
        with held_worker(loop, scheduler):  # all sixteen arrive before the first round starts
            streams = [asyncio.ensure_future(collect(scheduler, body), loop=loop) for body in bodies]
            loop.run_until_complete(asyncio.sleep(0.01))  # their first turns submit the jobs
        loop.run_until_complete(asyncio.gather(*streams))
    finally:
        scheduler.stop()
    choosing = [s for s in engine.steps if any(isinstance(op, Choose) for op in s.ops)]
    assert len(choosing) == 1 and len(choosing[0].ops) == 16
    assert engine.choices[0] == 16  # one choice for all sixteen, not sixteen choices
    assert [len(s.decode) for s in engine.steps if s.decode] == [16]


def test_a_decodes_chosen_first_token_joins_the_decode_forward_of_the_same_round(
    loop: asyncio.AbstractEventLoop,
) -> None:
    engine = RecordingEngine(slots=4)
    session = engine._new()
    session.length, session.has_logits = 5, True
    scheduler = Scheduler(engine, max_queue=64)  # type: ignore[arg-type]
    try:
        run(
            loop,
            scheduler,
            decode_steps(model(), session, Sampler(SamplingParams()), Stopping(2), feed_last=False),
        )
    finally:
        scheduler.stop()
    [round_] = [r for r in scheduler.steps if r.ops]
    assert round_.ops == 1 and len(round_.decode) == 1  # the choice and the forward: one round


def test_a_rounds_tokens_reach_their_caller_while_its_forward_runs(loop: asyncio.AbstractEventLoop) -> None:
    """The token a stream yielded is handed to the event loop as the round's decode forward starts
    (the engine's before-forward hook), not after it: the forward here waits until the caller has
    it, and would wait in vain were it handed out only once the round ends."""
    engine = RecordingEngine(slots=1)
    session = engine._new()
    session.length, session.has_logits = 5, True
    received, waited = threading.Event(), []
    engine.on_step = lambda step: waited.append(received.wait(5)) if step.decode else None
    scheduler = Scheduler(engine, max_queue=64)  # type: ignore[arg-type]

    async def stream() -> list[int]:
        ids = []
        body = decode_steps(model(), session, Sampler(SamplingParams()), Stopping(3), feed_last=False)
        async for events in scheduler.batches(body):
            ids += [e.id for e in events if isinstance(e, TokenOut)]
            received.set()
        return ids

    try:
        ids = loop.run_until_complete(stream())
    finally:
        scheduler.stop()
    assert ids == [5, 6, 7]
    assert waited == [True, True]  # each decode forward found the token before it in the caller's hands


def test_a_session_opened_in_a_round_prefills_in_that_round(
    loop: asyncio.AbstractEventLoop, scheduler: Scheduler, engine: RecordingEngine
) -> None:
    run(loop, scheduler, generate(tokens=4, new=1))
    first = scheduler.steps[0]
    assert len(first.prefill) == 1 and first.prefill[0][1] > 0


def test_n_samples_get_their_first_tokens_with_the_last_prefill_forward(
    loop: asyncio.AbstractEventLoop, scheduler: Scheduler, engine: RecordingEngine
) -> None:
    [events] = run(loop, scheduler, generate(tokens=5, new=2, n=3))
    last = next(s for s in engine.steps if s.prefills)
    request = last.prefills[0][0]
    assert len(request.copies) == 2 and len(request.samplers) == 3
    assert engine.choices == [3]
    assert len([e for e in events if isinstance(e, TokenOut)]) == 6
    assert engine.free_slots == 4


def test_one_step_carries_every_waiting_request_of_a_round(
    loop: asyncio.AbstractEventLoop, scheduler: Scheduler, engine: RecordingEngine
) -> None:
    run(loop, scheduler, *(generate(tokens=4, new=4) for _ in range(3)))
    widest = max(len(s.decode) for s in engine.steps)
    assert widest == 3, "the three streams never shared a decode forward"


def test_slots_go_to_the_oldest_waiting_jobs_first(loop: asyncio.AbstractEventLoop) -> None:
    engine = RecordingEngine(slots=1)
    scheduler = Scheduler(engine, max_queue=64)  # type: ignore[arg-type]
    order: list[str] = []

    def job(name: str) -> Generator[Any, Any, None]:
        [session] = yield Lend(Open())
        order.append(name)
        yield Rewind(session, 0)

    try:
        run(loop, scheduler, job("first"), job("second"), job("third"))
    finally:
        scheduler.stop()
    assert order == ["first", "second", "third"]
    assert engine.free_slots == 1


def test_a_closed_slot_is_granted_in_the_round_that_closes_it(loop: asyncio.AbstractEventLoop) -> None:
    engine = RecordingEngine(slots=1)
    held = engine._new()
    scheduler = Scheduler(engine, max_queue=64)  # type: ignore[arg-type]

    def closer() -> Generator[Any, Any, None]:
        yield Result((yield Close(held)))

    def opener() -> Generator[Any, Any, None]:
        sessions = yield Open()
        yield Result(sessions[0])

    try:
        run(loop, scheduler, closer(), opener())
    finally:
        scheduler.stop()
    both = [s for s in engine.steps if s.ops and s.opens]
    assert both, "the open waited a round for the slot the close freed"


def test_a_prompt_waiting_beside_decoding_streams_takes_the_shared_span(
    loop: asyncio.AbstractEventLoop, scheduler: Scheduler, engine: RecordingEngine
) -> None:
    decoding, submitted = threading.Event(), threading.Event()

    def hold_the_first_decode(step: Step) -> None:  # the prompt arrives while a stream decodes
        if step.decode and not decoding.is_set():
            decoding.set()
            submitted.wait(10)

    engine.on_step = hold_the_first_decode

    async def prompt_after_decoding_starts() -> None:
        streaming = asyncio.ensure_future(collect(scheduler, generate(tokens=2, new=12)))
        await asyncio.to_thread(decoding.wait, 10)
        prompt = asyncio.ensure_future(collect(scheduler, generate(tokens=30, new=1)))
        await asyncio.sleep(0.01)  # its first turn submits the job
        submitted.set()
        await asyncio.gather(streaming, prompt)

    loop.run_until_complete(prompt_after_decoding_starts())
    spans = [span for s in engine.steps for _, span in s.prefills if s.decode]
    assert spans and set(spans) == {SHARED_SPAN}


def test_a_burst_of_prompts_prefills_several_per_round(loop: asyncio.AbstractEventLoop) -> None:
    engine = RecordingEngine(slots=8)
    scheduler = Scheduler(engine, max_queue=64)  # type: ignore[arg-type]
    try:
        run(loop, scheduler, generate(tokens=2, new=30), *(generate(tokens=20, new=1) for _ in range(6)))
    finally:
        scheduler.stop()
    assert max(len(s.prefills) for s in engine.steps) == MAX_PREFILLS_PER_ROUND


def test_a_burst_on_an_engine_that_batches_prompts_offers_it_a_forwards_worth_each_round(
    loop: asyncio.AbstractEventLoop,
) -> None:
    engine = RecordingEngine(slots=16, prompt_batch=8)
    scheduler = Scheduler(engine, max_queue=64)  # type: ignore[arg-type]
    try:
        run(loop, scheduler, *(generate(tokens=20, new=2) for _ in range(12)))
    finally:
        scheduler.stop()
    rounds = [s.prefills for s in engine.steps if s.prefills]
    # The first round may start before every job has arrived, so the claim is on the widest round
    # that runs while nothing decodes: as many as one forward takes, not one.
    assert max(len(s.prefills) for s in engine.steps if not s.decode) == 8
    assert all(request.batchable for prefills in rounds for request, _ in prefills)  # a Generate's own


def test_a_sessions_prefill_never_shares_a_forward(
    loop: asyncio.AbstractEventLoop, scheduler: Scheduler, engine: RecordingEngine
) -> None:
    """A session's rows must stay a fresh run's (a later append re-runs only what a Decode wrote)."""
    session = engine._new()
    run(loop, scheduler, prefill_body(SessionState("s", "", session), list(range(1, 9))))
    assert [request.batchable for s in engine.steps for request, _ in s.prefills] == [False]


def test_a_failing_decode_row_fails_its_job_alone(loop: asyncio.AbstractEventLoop) -> None:
    engine = RecordingEngine(slots=2, fail_rows=frozenset({1}))
    # Steps wait a little while one session is open: on a loaded machine the first job could
    # otherwise finish on row 0 before the second is admitted, and row 1 would never decode.
    engine.on_step = lambda step: time.sleep(0.05) if len(engine.open) < 2 else None
    scheduler = Scheduler(engine, max_queue=64)  # type: ignore[arg-type]

    async def both() -> list[Any]:
        async def one() -> Any:
            try:
                return [e async for e in scheduler.stream(generate(tokens=3, new=4))]
            except InvalidInput as exc:
                return exc

        return list(await asyncio.gather(one(), one()))

    try:
        results = loop.run_until_complete(both())
    finally:
        scheduler.stop()
    assert sum(isinstance(r, InvalidInput) for r in results) == 1
    good = next(r for r in results if not isinstance(r, InvalidInput))
    assert len([e for e in good if isinstance(e, TokenOut)]) == 4
    assert engine.free_slots == 2  # the failed job's slot came back too


def test_sessions_lent_to_a_cancelled_job_return_to_the_pool(
    loop: asyncio.AbstractEventLoop, scheduler: Scheduler, engine: RecordingEngine
) -> None:
    started = threading.Event()

    def endless() -> Generator[Any, Any, None]:
        [session] = yield Lend(Open())
        started.set()
        while True:
            yield Token(DecodeRow(session, 0, Sampler(SamplingParams())))

    async def cancel_midway() -> None:
        job = scheduler.submit(endless())
        while not started.is_set():
            await asyncio.sleep(0.001)
        job.cancel(asyncio.CancelledError())
        while not job.done:
            await asyncio.sleep(0.001)
        for _ in range(100):
            if engine.free_slots == 4:
                return
            await asyncio.sleep(0.001)

    loop.run_until_complete(cancel_midway())
    assert engine.free_slots == 4


def test_a_fork_is_timed_and_takes_a_slot(
    loop: asyncio.AbstractEventLoop, scheduler: Scheduler, engine: RecordingEngine
) -> None:
    from service.worker.rounds import Timed

    source = engine._new()
    source.length = 7

    def forking() -> Generator[Any, Any, None]:
        yield Result((yield Timed(Fork(source, 3))))

    session, seconds = loop.run_until_complete(scheduler.result(forking()))
    assert session.length == 3 and seconds == pytest.approx(0.001)
    assert engine.free_slots == 2
