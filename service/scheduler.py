"""The engine worker: one thread owns the engine and runs it in rounds.

Contract: a job is a generator run on the worker thread. It yields events for
its caller, and requests for the engine: `Call` (run now, on the worker),
`OpenSlot` (wait for a free KV slot), `Chunk` (one prefill forward) and
`Token` (one row of a decode step); what a request returns is sent back into
the generator. Jobs never touch the engine between requests.

Each round: every job that is not waiting runs up to its next request; free
slots go to the jobs waiting for one, oldest first (`slot_grants`: one that
cannot start until sessions close does not hold back the rest); prefill forwards run
(`prefill_plan`); then one decode forward advances every job waiting on a
token, whatever its session's length. So a long prompt delays running streams
by at most one prefill forward per token, and sixteen streams cost one
forward per token, not sixteen. `steps` keeps a log of what each round ran.
Every forward's duration goes to `on_forward` ("prefill" or "decode", seconds:
the metrics) and, at debug level, to one log line naming its requests.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from engine.errors import EngineFault
from engine.executor import Engine, Session
from service.errors import Cancelled, QueueFull
from service.requests import (
    Call,
    Chunk,
    OpenSlot,
    StepRecord,
    Token,
    Tokens,
    decode_rows,
    prefill_plan,
    slot_grants,
)

log = structlog.get_logger("ladder.scheduler")
T = TypeVar("T")
Body = Generator[Any, Any, None]


@dataclass(frozen=True)
class _End:
    error: BaseException | None = None


@dataclass(frozen=True)
class _Result:
    value: Any


def _prefill_detail(job: Job) -> dict[str, Any]:
    """The debug line's detail of the prefill forward `job` just ran."""
    report = job.reply
    return {"request_id": job.request_id, "width": report.width, "rows": report.forward.rows,
            "past": report.forward.past}


def _put_all(items: list[tuple[Job, Any]]) -> None:
    for job, item in items:
        job.events.put_nowait(item)


_WAKE = object()
_STOP = object()


class Job:
    """One request on the worker: its generator and the asyncio queue its events go to."""

    def __init__(self, body: Body, loop: asyncio.AbstractEventLoop, bounded: bool, serial: int,
                 wake: Callable[[], None], outbox: Callable[[Job, Any], None], hold: bool = False) -> None:
        self.body = body
        self.bounded = bounded  # counts toward the queue bound (requests, not internal calls)
        self.hold = hold  # events wait for the end of the job (a unary call needs them only then)
        self.held: list[Any] = []
        self.loop = loop
        self.serial = serial  # arrival order
        self.events: asyncio.Queue[Any] = asyncio.Queue()
        self.abort_error: BaseException | None = None
        self.want: OpenSlot | Chunk | Token | None = None  # the request it waits on
        self.slots = 0  # KV slots granted to it: back in the pool when it ends (service.requests.slot_grants)
        self.reply: Any = None
        self.error: BaseException | None = None  # thrown into the body at its next step
        self.done = False
        self._wake = wake
        self._outbox = outbox
        self.request_id = str(structlog.contextvars.get_contextvars().get("request_id", ""))  # debug lines

    def cancel(self, error: BaseException) -> None:
        """Stop the job before its next step (thread-safe; a finished job ignores it)."""
        if self.abort_error is None and not self.done:
            self.abort_error = error
            self._wake()

    def deliver(self, item: Any) -> None:
        if self.hold and not isinstance(item, _End):
            self.held.append(item)
            return
        for held in self.held:
            self._outbox(self, held)
        self.held.clear()
        self._outbox(self, item)

    def answer(self, reply: Any = None, error: BaseException | None = None) -> None:
        self.want, self.reply, self.error = None, reply, error


class Scheduler:
    def __init__(self, engine: Engine, max_queue: int,
                 on_fault: Callable[[BaseException], None] | None = None, log_steps: int = 4096,
                 on_forward: Callable[[str, float], None] | None = None) -> None:
        self.engine = engine
        self.max_queue = max_queue
        self.on_fault = on_fault
        self.on_forward = on_forward  # (kind, seconds) of every forward, called on the worker
        self.steps: deque[StepRecord] = deque(maxlen=log_steps)
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._active: list[Job] = []
        self._lock = threading.Lock()
        self._depth = 0
        self.submitted = 0  # jobs submitted since start (tests wait on it)
        self._serials = itertools.count(1)
        self._rounds = 0
        self._refusal: BaseException | None = None
        self._posted: dict[asyncio.AbstractEventLoop, list[tuple[Job, Any]]] = {}
        self._thread = threading.Thread(target=self._run, name="ladder-engine", daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        """Requests the worker holds (running, or waiting for a slot)."""
        return self._depth

    @property
    def waiting(self) -> int:
        """Jobs waiting for a free KV slot."""
        return sum(1 for job in list(self._active) if isinstance(job.want, OpenSlot))

    # -- the event-loop side ------------------------------------------------------
    def submit(self, body: Body, *, bounded: bool = True, hold: bool = False) -> Job:
        with self._lock:
            if self._refusal is not None:
                body.close()
                raise self._refusal
            if bounded and self._depth >= self.max_queue:
                body.close()
                raise self._full()
            self._depth += bounded
            self.submitted += 1
        job = Job(body, asyncio.get_running_loop(), bounded, next(self._serials), self._wake, self._post,
                  hold)
        self._inbox.put(job)
        return job

    def _full(self) -> QueueFull:
        """The refusal of a request over the queue bound: SESSIONS_FULL when every KV slot is held
        (sessions are the bottleneck), else QUEUE_FULL. By the slots, not by which queued requests
        the worker has reached yet, so a burst gets the reason a trickle of the same load gets."""
        waiting, free = self.waiting, self.engine.free_slots  # an int read: safe off the worker
        metadata = {"max_queue": str(self.max_queue), "waiting_for_slot": str(waiting),
                    "free_slots": str(free)}
        if not free:
            return QueueFull(f"every KV slot is in use and the engine worker holds {self._depth} "
                             f"requests ({waiting} seen waiting for a slot)", reason="SESSIONS_FULL",
                             metadata=metadata)
        return QueueFull(f"the engine worker already holds {self._depth} requests", reason="QUEUE_FULL",
                         metadata=metadata)

    async def stream(self, body: Body, *, bounded: bool = True, hold: bool = False) -> AsyncIterator[Any]:
        """Run `body` on the worker and yield its events; leaving early cancels the job.

        With `hold` the events arrive together when the job ends: a unary call then costs the
        event loop nothing per token, which is what lets many of them share one decode forward."""
        job = self.submit(body, bounded=bounded, hold=hold)
        try:
            while True:
                item = await job.events.get()
                if isinstance(item, _End):
                    if item.error is not None:
                        raise item.error
                    return
                yield item
        finally:
            job.cancel(Cancelled("the call ended before its job"))

    async def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the worker (between two forwards) and return its result."""
        def body() -> Body:
            yield _Result((yield Call(fn)))

        return await self._result(body(), bounded=False)  # type: ignore[no-any-return]

    async def open_session(self, scope: str = "") -> Any:
        """A new engine session, once a KV slot is free (waiting in the bounded queue meanwhile)."""
        def body() -> Body:
            yield _Result((yield OpenSlot(scope=scope)))

        return await self._result(body(), bounded=True)

    async def _result(self, body: Body, *, bounded: bool) -> Any:
        async for item in self.stream(body, bounded=bounded):
            return item.value
        raise AssertionError("a call job always yields its result")

    def abort_all(self, error: BaseException) -> None:
        """End every job before its next step with `error`, and refuse new ones (drain deadline)."""
        self._refusal = error
        for job in list(self._active):
            job.cancel(error)

    def stop(self) -> None:
        self._inbox.put(_STOP)
        self._thread.join(timeout=10)

    def _wake(self) -> None:
        self._inbox.put(_WAKE)

    # -- the worker thread ---------------------------------------------------------
    def _run(self) -> None:
        while True:
            if not self._admit(block=not self._busy()):
                self._flush()  # the ends of the jobs the stop closed
                return
            self._round()  # flushes what its jobs yielded before its forwards run

    def _post(self, job: Job, item: Any) -> None:
        self._posted.setdefault(job.loop, []).append((job, item))

    def _flush(self) -> None:
        """Hand the round's events to their event loops: one wake-up per loop, not one per token."""
        posted, self._posted = self._posted, {}
        for loop, items in posted.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # the event loop is gone: nobody is listening any more
                pass

    def _busy(self) -> bool:
        """Whether a round has anything to do without new input."""
        running = Chunk | Token | Tokens
        for job in self._active:
            if job.abort_error is not None or job.want is None or isinstance(job.want, running):
                return True
        return bool(self._grants()[1])

    def _admit(self, block: bool) -> bool:
        """Move new jobs into the round; False when told to stop."""
        try:
            item = self._inbox.get(block=block)
            while True:
                if item is _STOP:
                    for job in list(self._active):
                        self._close(job, Cancelled("the server stopped"))
                    return False
                if isinstance(item, Job):
                    self._active.append(item)
                item = self._inbox.get_nowait()
        except queue.Empty:
            return True

    def _round(self) -> None:
        closed = []
        for job in list(self._active):
            if job.abort_error is not None:
                self._close(job, job.abort_error)
                closed.append(job.serial)
            elif job.want is None:
                self._advance(job)
        # What the jobs just yielded (a token chosen last round, a forward's report) goes out now,
        # while this round's forwards run: not one forward late.
        self._flush()
        self._grant_slots()
        prefill = self._prefill()
        decode, batch = self._decode()
        if prefill or decode or closed:
            self._rounds += 1
            self.steps.append(StepRecord(self._rounds, tuple(closed), prefill, decode, batch))

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
            if isinstance(item, Call):
                self._answer(job, item.fn)
            elif isinstance(item, Token | Tokens):
                for row in decode_rows(item):
                    self._answer(job, functools.partial(self.engine.check_decode, row))
                    if job.error is not None:
                        break
                else:
                    job.want = item
                    return
            elif isinstance(item, OpenSlot | Chunk):
                job.want = item
                return
            elif item is not None:
                job.deliver(item)

    def _answer(self, job: Job, fn: Callable[[], Any]) -> None:
        try:
            job.answer(fn())
        except Exception as exc:  # noqa: BLE001 — the job decides what a failure means
            self._fault(exc)
            job.answer(error=exc)

    def _waiting(self, kind: type) -> list[Job]:
        # _active is in arrival order: jobs are appended as they are admitted.
        return [j for j in self._active if isinstance(j.want, kind)]

    def _grants(self) -> tuple[list[Job], tuple[int, ...]]:
        """The jobs waiting for slots, and which of them get them now (service.requests.slot_grants)."""
        waiting = self._waiting(OpenSlot)
        needs = [job.want.count for job in waiting]  # type: ignore[union-attr]
        returning = sum(job.slots for job in self._active)
        return waiting, slot_grants(needs, self.engine.free_slots, returning)

    def _grant_slots(self) -> None:
        waiting, granted = self._grants()
        for i in granted:
            job = waiting[i]
            assert isinstance(job.want, OpenSlot)
            count = job.want.count
            first = functools.partial(self.engine.open_session, job.want.scope, job.want.prompt)
            self._answer(job, first if count == 1 else functools.partial(self._open, job.want))
            job.slots = count if job.error is None else 0

    def _open(self, want: OpenSlot) -> list[Session]:
        first = self.engine.open_session(want.scope, want.prompt)
        return [first, *(self.engine.open_session(want.scope) for _ in range(want.count - 1))]

    def _prefill(self) -> tuple[tuple[int, int], ...]:
        """Run this round's prefill forwards, oldest job first (see `prefill_plan`)."""
        jobs = self._waiting(Chunk)
        decoding = any(isinstance(j.want, Token | Tokens) for j in self._active)
        ran = []
        for job, span in zip(jobs, prefill_plan(len(jobs), decoding, self.engine.shared_span), strict=False):
            assert isinstance(job.want, Chunk)
            task = job.want.task
            started = time.perf_counter()
            self._answer(job, functools.partial(self.engine.prefill_step, task, span))
            if job.error is None:
                self._forward_done("prefill", started, functools.partial(_prefill_detail, job))
            ran.append((job.serial, job.reply.width if job.error is None else 0))
        return tuple(ran)

    def _forward_done(self, kind: str, started: float, detail: Callable[[], dict[str, Any]]) -> None:
        seconds = time.perf_counter() - started
        if self.on_forward is not None:
            self.on_forward(kind, seconds)
        if log.is_enabled_for(logging.DEBUG):  # the detail is built only for a debug line
            log.debug(f"{kind}_forward", ms=round(seconds * 1000.0, 3), **detail())

    def _decode(self) -> tuple[tuple[tuple[int, int], ...], int]:
        """One decode forward for every job waiting on a token."""
        jobs = self._waiting(Token | Tokens)
        if not jobs:
            return (), 0
        wanted = [decode_rows(j.want) for j in jobs]
        rows = [row for job_rows in wanted for row in job_rows]
        started = time.perf_counter()
        try:
            tokens = self.engine.decode_checked(rows)  # each row was checked as its job asked for it
        except Exception as exc:  # noqa: BLE001 — every row of a failed forward fails
            self._fault(exc)
            for job in jobs:
                job.answer(error=exc)
            return (), 0
        picked = iter(tokens)
        for job, job_rows in zip(jobs, wanted, strict=True):
            mine = [next(picked) for _ in job_rows]
            job.answer(mine if isinstance(job.want, Tokens) else mine[0])
        self._forward_done("decode", started, lambda: {
            "rows": len(rows), "batch": self.engine.last_batch, "request_ids": [j.request_id for j in jobs]})
        decoded = tuple((j.serial, r.session.row)
                        for j, job_rows in zip(jobs, wanted, strict=True) for r in job_rows)
        return decoded, self.engine.last_batch

    def _fault(self, exc: BaseException) -> None:
        if isinstance(exc, EngineFault) and self.on_fault is not None:
            self.on_fault(exc)

    def _close(self, job: Job, error: BaseException) -> None:
        """End a job early: its finally blocks run here (sessions it opened are closed)."""
        try:
            job.body.close()
        except Exception as exc:  # noqa: BLE001 — a failing clean-up must never stop the worker
            log.error("job_cleanup_failed", error=repr(exc))
        granted = job.reply if isinstance(job.reply, list) else [job.reply]
        for session in granted:  # slots granted to a job that never saw them
            if isinstance(session, Session):
                self.engine.close_session(session)
        self._finish(job, error)

    def _finish(self, job: Job, error: BaseException | None) -> None:
        job.done = True
        self._active.remove(job)
        with self._lock:
            self._depth -= job.bounded
        job.deliver(_End(error))
