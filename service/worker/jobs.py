"""A job: one request on the engine worker, its generator and the asyncio queue its events go to.

The scheduler (service/worker/scheduler.py) runs jobs; this module is what a job is and how what it
yields reaches its caller: events in order, a held unary call's events at its end, and `End` last,
a round's events handed to each event loop in one wake-up (`Outbox`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import structlog

from engine.executor import Session
from engine.executor.step import Request
from service.events import Finished, ForwardDone, PromptLogprobs, Shared, Started, TokenOut


@dataclass(frozen=True)
class End:
    error: BaseException | None = None


@dataclass(frozen=True)
class Result:
    """A job's answer to `Scheduler.result`."""

    value: Any


Event = Started | ForwardDone | Shared | TokenOut | Finished | PromptLogprobs | Result  # for the job's caller
Item = Request[object] | Event  # what a job body yields: a request for the worker, or an event
Body = Generator[Item, object, None]  # a job: what it yields, and the replies sent back into it


Delivered = Event | End  # what reaches the job's caller


Sink = Callable[[list[Event]], None]  # takes a job's events on its event loop, in order


def put_all(items: list[tuple[Job, Delivered]]) -> None:
    """One round's deliveries on the event loop: into each job's queue, or, for a job with a sink,
    its events handed to the sink at once in one list (no task wakes for them) and only its End
    into the queue, after them."""
    sunk: dict[Job, list[Event]] = {}
    for job, item in items:
        if job.sink is None:
            job.events.put_nowait(item)
        elif not isinstance(item, End):
            sunk.setdefault(job, []).append(item)
        else:
            if job in sunk:
                job.sink(sunk.pop(job))
            job.events.put_nowait(item)
    for job, events in sunk.items():
        if job.sink is not None:
            job.sink(events)


class Job:
    """One request on the worker: its generator and the asyncio queue its events go to."""

    def __init__(
        self,
        body: Body,
        loop: asyncio.AbstractEventLoop,
        bounded: bool,
        serial: int,
        cancelled: Callable[[Job], None],
        outbox: Callable[[Job, Delivered], None],
        hold: bool = False,
        sink: Sink | None = None,
    ) -> None:
        self.body = body
        self.sink = sink  # where its events go on the event loop (None: its queue, as End always)
        self.bounded = bounded  # counts toward the queue bound (requests, not internal calls)
        self.hold = hold  # events wait for the end of the job (a unary call needs them only then)
        self.held: list[Event] = []
        self.loop = loop
        self.serial = serial  # arrival order
        self.events: asyncio.Queue[Delivered] = asyncio.Queue()
        self.abort_error: BaseException | None = None
        self.want: Request[object] | None = None  # the request it waits on
        self.slots = 0  # KV slots lent to it: back in the pool when it ends (rounds.slot_grants)
        self.lent: list[Session] = []  # sessions closed when it ends
        self.reply: object = None
        self.error: BaseException | None = None  # thrown into the body at its next step
        self.done = False
        self._cancelled = cancelled  # tells the worker (thread-safe)
        self._outbox = outbox
        self.request_id = str(structlog.contextvars.get_contextvars().get("request_id", ""))  # debug lines

    def cancel(self, error: BaseException) -> None:
        """Stop the job before its next step (thread-safe; a finished job ignores it)."""
        if self.abort_error is None and not self.done:
            self.abort_error = error
            self._cancelled(self)

    def deliver(self, item: Delivered) -> None:
        if not self.hold:
            self._outbox(self, item)
        elif not isinstance(item, End):
            self.held.append(item)
        else:
            for held in self.held:
                self._outbox(self, held)
            self.held.clear()
            self._outbox(self, item)

    def answer(self, reply: object = None, error: BaseException | None = None) -> None:
        self.want, self.reply, self.error = None, reply, error


class Outbox:
    """A round's events on the worker, on their way to their jobs' event loops: one wake-up per loop
    and round (`put_all` there), not one per token.

    A wake-up lets the event loop's thread take the interpreter. Issued while the worker still has
    Python to run (the round's first step, the step's own work before its forward), the worker then
    waits for the loop's turn, up to the 5 ms switch interval; a forward runs without the
    interpreter, so the loop's turn then costs the worker nothing. So the round's events are held
    back (`at_forward`) until the engine starts a forward (its before-forward hook calls
    `release`) or the round ends."""

    def __init__(self) -> None:
        self._posted: dict[asyncio.AbstractEventLoop, list[tuple[Job, Delivered]]] = {}
        self._held_back = False

    def post(self, job: Job, item: Delivered) -> None:
        posted = self._posted.get(job.loop)
        if posted is None:
            posted = self._posted[job.loop] = []
        posted.append((job, item))

    def at_forward(self) -> None:
        """Hand what is posted out once the engine's next forward starts, or the round ends."""
        self._held_back = True

    def release(self) -> None:
        """A forward is about to start, or the round is over: hand out what `at_forward` held."""
        if self._held_back:
            self._held_back = False
            self.flush()

    def flush(self) -> None:
        """Hand what is posted to its event loops now."""
        posted, self._posted = self._posted, {}
        for loop, items in posted.items():
            try:
                loop.call_soon_threadsafe(put_all, items)
            except RuntimeError:  # the event loop is gone: nobody is listening any more
                pass
