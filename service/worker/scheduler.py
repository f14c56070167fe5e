"""The engine worker: one thread owns the engine and drives it one step per round.

Contract: a job is a generator run on the worker thread. It yields events for its
caller and requests for the engine: the engine's step requests (engine/executor/step.py:
`Open`, `Prefill`, `Choose`, `Fork`, `Rewind`, `Reset`, `Close`, `Stats`), `Lend`
(sessions the job holds until it ends), `Token`/`Tokens` (rows of a decode forward) and
`Timed` (an operation and its duration); what a request returns is sent back into the
generator. Jobs never touch the engine: `engine.step` is the one way in (`Call`, which runs a
function on the worker, exists for tests and tools).

Jobs waiting for a KV slot (an `Open` or `Lend`) wait in a queue of their own, in arrival order,
served from its head (`slot_grants`); a round walks the jobs that can run, not that queue, so a
thousand requests queued cost a round what the head of the queue costs. A waiting job that is
cancelled comes back through the inbox and is ended in the next round. A Generate's samples
(`Lend(fan=True)`) start once one slot is free, taking as many as the requests granted beside
them leave (`grant_sizes`); as they run, the job asks for more (`Spare`: forks of its prompt's
session, answered in the round with the slots the queue leaves, after giving back the sessions
of samples that ended), and waits in the queue only when nothing of it runs.

Each round: every job that is not waiting runs up to its next request; then two `Step`s run.
The first: the session operations asked for (Choose ops in one batched choice) and free slots
for the jobs waiting for one, oldest first (`slot_grants`: one that cannot start until sessions
close does not hold back the rest). The jobs it answered run up to their next request, and the
second step runs the prefill forwards (`prefill_plan`, the first tokens of finished prompts in one
batched choice) and one decode forward that advances every job waiting on a token, whatever its
session's length: a Decode's first token and its second come in one round. So a long prompt
delays running streams by at most one prefill forward per token,
and sixteen streams cost one forward per token, not sixteen. `steps` keeps a log of what each
round ran. Each step's outcomes go back to the jobs that asked (service/worker/answers.py). Every
forward's duration goes to `on_forward` ("prefill" or "decode", seconds: the metrics) and, at
debug level, to one log line naming its requests. Sessions lent to a job are closed in the round
after it ends.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from engine.errors import EngineFault
from engine.executor import Session
from engine.executor.step import (
    Close,
    Driven,
    Fork,
    Open,
    Outcome,
    Prefill,
    Request,
    SessionOp,
    Step,
    StepResult,
)
from service.errors import Cancelled, QueueFull
from service.worker.answers import Answers
from service.worker.job_calls import JobCalls
from service.worker.jobs import Body, End, Job, Outbox, Sink
from service.worker.rounds import (
    DECODE_REQUESTS,
    Call,
    Lend,
    Spare,
    StepRecord,
    Verdict,
    prefill_plan,
    session_op,
    slot_need,
    wants_of,
)
from service.worker.slots import granted, slot_work

log = structlog.get_logger("ladder.scheduler")


_STOP = object()
_WAKE = object()  # a verdict landed on a job that waits for one (service/front/texts.py)


@dataclass(frozen=True)
class _Cancelled:
    """A job cancelled off the worker: ended in the next round wherever it waits."""

    job: Job


class Scheduler(JobCalls):
    """The worker: `submit` (from any event loop) queues a job, the thread runs the rounds; the
    awaitable calls on top of `submit` are JobCalls' (service/worker/job_calls.py)."""

    def __init__(
        self,
        engine: Driven,
        max_queue: int,
        on_fault: Callable[[BaseException], None] | None = None,
        log_steps: int = 4096,
        on_forward: Callable[[str, float], None] | None = None,
    ) -> None:
        self.engine = engine
        self.max_queue = max_queue
        self.on_fault = on_fault
        self.on_forward = on_forward  # (kind, seconds) of every forward, called on the worker
        self.steps: deque[StepRecord] = deque(maxlen=log_steps)
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._running: list[Job] = []  # jobs not waiting for a KV slot, in arrival order
        self._queued: list[Job] = []  # jobs waiting for KV slots (Open, Lend), in arrival order
        self._lock = threading.Lock()
        self._depth = 0
        self.submitted = 0  # jobs submitted since start (tests wait on it)
        self._serials = itertools.count(1)
        self._rounds = 0
        self._refusal: BaseException | None = None
        self._closing: list[Session] = []  # sessions of ended jobs, closed in the next step
        self._ending: list[tuple[Job, BaseException | None]] = []  # their jobs, told once closed
        self._answers = Answers(self._fault, self._forward_done)  # a step's outcomes to their jobs
        self._outbox = Outbox()  # the jobs' events on their way to the event loops
        engine.before_forward(self._outbox.release)
        self._thread = threading.Thread(target=self._run, name="ladder-engine", daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        """Requests the worker holds (running, or waiting for a slot)."""
        return self._depth

    @property
    def waiting(self) -> int:
        """Jobs waiting for a free KV slot (a length read: safe off the worker)."""
        return len(self._queued)

    # -- the event-loop side ------------------------------------------------------
    def submit(
        self, body: Body, *, bounded: bool = True, hold: bool = False, sink: Sink | None = None
    ) -> Job:
        with self._lock:
            if self._refusal is not None:
                body.close()
                raise self._refusal
            if bounded and self._depth >= self.max_queue:
                body.close()
                raise self._full()
            self._depth += bounded
            self.submitted += 1
        job = Job(
            body,
            asyncio.get_running_loop(),
            bounded,
            next(self._serials),
            self._cancelled,
            self._outbox.post,
            hold,
            sink,
        )
        self._inbox.put(job)
        return job

    def _full(self) -> QueueFull:
        """The refusal of a request over the queue bound: SESSIONS_FULL when every KV slot is held
        (sessions are the bottleneck), else QUEUE_FULL. By the slots, not by which queued requests
        the worker has reached yet, so a burst gets the reason a trickle of the same load gets."""
        waiting, free = self.waiting, self.engine.free_slots  # an int read: safe off the worker
        metadata = {
            "max_queue": str(self.max_queue),
            "waiting_for_slot": str(waiting),
            "free_slots": str(free),
        }
        if not free:
            return QueueFull(
                f"every KV slot is in use and the engine worker holds {self._depth} "
                f"requests ({waiting} seen waiting for a slot)",
                reason="SESSIONS_FULL",
                metadata=metadata,
            )
        return QueueFull(
            f"the engine worker already holds {self._depth} requests", reason="QUEUE_FULL", metadata=metadata
        )

    def abort_all(self, error: BaseException) -> None:
        """End every job before its next step with `error`, and refuse new ones (drain deadline)."""
        self._refusal = error
        for job in [*self._running, *self._queued]:
            job.cancel(error)

    def stop(self) -> None:
        self._inbox.put(_STOP)
        self._thread.join(timeout=10)

    def _cancelled(self, job: Job) -> None:
        self._inbox.put(_Cancelled(job))

    def wake(self) -> None:
        """Nudge the worker: a job waiting on a `Verdict` may go on (thread-safe)."""
        self._inbox.put(_WAKE)

    # -- the worker thread ---------------------------------------------------------
    def _run(self) -> None:
        while True:
            if not self._admit(block=not self._busy()):
                self._outbox.flush()  # the ends of the jobs the stop closed
                return
            self._round()  # hands out what its jobs yielded as its first forward starts
            self._outbox.release()  # or now, where it ran none

    def _busy(self) -> bool:
        """Whether a round has anything to do without new input."""
        if self._closing:
            return True
        for job in self._running:
            want = job.want
            if job.abort_error is not None or want is None or session_op(want) is not None:
                return True
            if isinstance(want, Spare):  # answered in the round, slots or none
                return True
            if type(want) is Verdict and want.judged():
                return True
            if isinstance(want, (Prefill, *DECODE_REQUESTS)):
                return True
        wants = wants_of(self._running)
        return bool(granted(self._queued, wants.spares, max(self.engine.free_slots, 0), wants.returning))

    def _wait_for_slots(self, job: Job) -> None:
        """A running job that now waits for KV slots: into the queue, in arrival order."""
        self._running.remove(job)
        bisect.insort(self._queued, job, key=lambda j: j.serial)

    def _run_again(self, jobs: list[Job]) -> None:
        """Jobs of the queue that no longer wait for slots (granted, or to be ended): running again."""
        for job in jobs:
            if job in self._queued and (slot_need(job.want) is None or job.abort_error is not None):
                self._queued.remove(job)
                bisect.insort(self._running, job, key=lambda j: j.serial)

    def _admit(self, block: bool) -> bool:
        """Move new jobs into the round; False when told to stop."""
        try:
            item = self._inbox.get(block=block)
            while True:
                if item is _STOP:
                    for job in [*self._running, *self._queued]:
                        self._close(job, Cancelled("the server stopped"))
                    self._step(Step(ops=self._take_closing()))
                    self._ended()
                    return False
                if isinstance(item, Job):
                    self._running.append(item)
                elif isinstance(item, _Cancelled) and item.job in self._queued:
                    self._run_again([item.job])
                item = self._inbox.get_nowait()
        except queue.Empty:
            return True

    def _round(self) -> None:
        """One round, two steps: first the session operations and opens (with the slots those
        operations free), then — once the jobs they answered ran up to their next request — the
        prefill forwards and the decode forward. So a Decode's chosen first token joins this
        round's decode forward, and a session opened this round prefills in it."""
        closed = []
        for job in list(self._running):
            if job.abort_error is not None:
                self._close(job, job.abort_error)
                closed.append(job.serial)
            elif job.want is None:
                self._advance(job)
            elif type(job.want) is Verdict and job.want.judged():
                job.answer()
                self._advance(job)
        # What the jobs just yielded (a token chosen last round, a forward's report) goes out as
        # this round's first forward starts: not one forward late, and not while the worker needs
        # the interpreter for the step's own work.
        self._outbox.at_forward()
        closing = self._take_closing()
        wants = wants_of(self._running)
        op_jobs = wants.ops
        ops = (*closing, *(op for job in op_jobs if (op := session_op(job.want)) is not None))
        freed = sum(isinstance(op, Close) for op in ops) - sum(isinstance(op, Fork) for op in ops)
        slots = slot_work(self._queued, wants.spares, self.engine.free_slots + freed, wants.returning)
        open_jobs, forking = slots.open_jobs, slots.forking
        first = Step(opens=tuple(slots.opens), ops=(*ops, *slots.releases, *slots.forks))
        choices = 0
        if first or forking:
            result = self._step(first)
            self._ended()
            self._answers.ops(op_jobs, result, len(closing))
            self._answers.spares(forking, result, len(ops) + len(slots.releases))
            self._answers.opens(open_jobs, result)
            spared = [job for job, _ in forking]
            self._run_again([*open_jobs, *spared])
            choices = result.choices
            for job in (*op_jobs, *open_jobs, *spared):
                if job.want is None and not job.done:
                    self._advance(job)
            self._outbox.at_forward()
            wants = wants_of(self._running)  # the jobs the first step answered have moved on
        prefill_jobs = wants.prefills
        decode_jobs = wants.decodes
        spans = prefill_plan(
            len(prefill_jobs), bool(decode_jobs), self.engine.shared_span, self.engine.facts.prompt_batch
        )
        prefill_jobs = prefill_jobs[: len(spans)]
        second = Step(
            prefills=tuple((_prefill(job), span) for job, span in zip(prefill_jobs, spans, strict=True)),
            decode=tuple(wants.rows),
        )
        if not first and not second and not closed:
            return
        result = self._step(second)
        prefill = self._answers.prefills(prefill_jobs, result)
        decode = self._answers.decode(decode_jobs, result)
        self._rounds += 1
        self.steps.append(
            StepRecord(
                self._rounds, tuple(closed), prefill, decode, result.batch, len(ops), choices + result.choices
            )
        )

    def _step(self, step: Step) -> StepResult:
        """Run one step on the engine; a failure outside any item (a bug) fails every item."""
        if not step:
            return StepResult()
        try:
            return self.engine.step(step)
        except Exception as exc:  # noqa: BLE001 — a failing step must never stop the worker
            self._fault(exc)
            failed = Outcome(error=exc)
            ops, prefills = len(step.ops), len(step.prefills)
            return StepResult(
                opens=(failed,) * len(step.opens),
                ops=(failed,) * ops,
                op_seconds=(0.0,) * ops,
                prefills=(failed,) * prefills,
                decode=(failed,) * len(step.decode),
                prefill_seconds=(0.0,) * prefills,
            )

    def _advance(self, job: Job) -> None:
        """Run the job up to the request it must wait for (events delivered, calls answered)."""
        while True:
            try:
                error, job.error = job.error, None
                reply, job.reply = job.reply, None
                item = job.body.send(reply) if error is None else job.body.throw(error)
            except StopIteration:
                self._finish(job, None)
                return
            except Exception as exc:  # noqa: BLE001 — a failing job must never stop the worker
                self._fault(exc)
                self._finish(job, exc)
                return
            if not isinstance(item, Request):  # an event, passed on at once
                if item is not None:
                    job.deliver(item)
            elif isinstance(item, Call):
                try:
                    job.answer(item.fn())
                except Exception as exc:  # noqa: BLE001 — the job decides what a failure means
                    self._fault(exc)
                    job.answer(error=exc)
            else:
                job.want = item
                if type(item) in _QUEUED and slot_need(item) is not None:
                    self._wait_for_slots(job)
                return

    def _forward_done(self, kind: str, seconds: float, detail: Callable[[], dict[str, Any]]) -> None:
        if self.on_forward is not None:
            self.on_forward(kind, seconds)
        if log.is_enabled_for(logging.DEBUG):  # the detail is built only for a debug line
            log.debug(f"{kind}_forward", ms=round(seconds * 1000.0, 3), **detail())

    def _fault(self, exc: BaseException) -> None:
        if isinstance(exc, EngineFault) and self.on_fault is not None:
            self.on_fault(exc)

    def _close(self, job: Job, error: BaseException) -> None:
        """End a job early: its finally blocks run here; sessions lent to it, or granted to it
        before it saw them, close in this round's step."""
        try:
            job.body.close()
        except Exception as exc:  # noqa: BLE001 — a failing clean-up must never stop the worker
            log.error("job_cleanup_failed", error=repr(exc))
        if slot_need(job.want) is None and isinstance(job.reply, list) and not job.lent:
            job.lent = [s for s in job.reply if isinstance(s, Session)]  # granted, never seen
        self._finish(job, error)

    def _finish(self, job: Job, error: BaseException | None) -> None:
        job.done = True
        (self._running if job in self._running else self._queued).remove(job)
        with self._lock:
            self._depth -= job.bounded
        if job.lent:  # its caller hears the end once the step that closes them has run
            self._closing.extend(job.lent)
            job.lent = []
            self._ending.append((job, error))
        else:
            job.deliver(End(error))

    def _take_closing(self) -> tuple[SessionOp, ...]:
        closing, self._closing = self._closing, []
        return tuple(Close(session) for session in closing)

    def _ended(self) -> None:
        """Tell the callers of jobs whose lent sessions the step just closed that they ended."""
        ending, self._ending = self._ending, []
        for job, error in ending:
            job.deliver(End(error))
        if ending:
            self._outbox.flush()


def _prefill(job: Job) -> Prefill:
    """The `Prefill` a job waits on (one of `Wants.prefills`)."""
    assert isinstance(job.want, Prefill)
    return job.want


_QUEUED = frozenset({Open, Lend, Spare})  # the requests that may wait in the queue (`slot_need`)
