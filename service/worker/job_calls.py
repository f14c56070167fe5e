"""The event loop's ways to run a job on the engine worker and wait for it: its events as they
come (`stream`, `batches`) or the one value it yields (`result`, and `run`, `call`, `open_session`
built on it). Leaving one early cancels the job. The worker's own side is
service/worker/scheduler.py, whose `submit` they all go through."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any, TypeVar, cast

from engine.executor.step import Open, Request
from service.errors import Cancelled
from service.worker.jobs import Body, End, Event, Job, Result, Sink
from service.worker.rounds import Call, ask

T = TypeVar("T")


class JobCalls(ABC):
    """Awaitable calls on top of `submit` (the worker's queue)."""

    @abstractmethod
    def submit(
        self, body: Body, *, bounded: bool = True, hold: bool = False, sink: Sink | None = None
    ) -> Job:
        """Hand `body` to the worker as a job (refused with QueueFull over the queue's bound)."""

    async def stream(
        self, body: Body, *, bounded: bool = True, hold: bool = False
    ) -> AsyncGenerator[Any, None]:
        """Run `body` on the worker and yield its events; leaving early cancels the job.

        With `hold` the events arrive together when the job ends: a unary call then costs the
        event loop nothing per token, which is what lets many of them share one decode forward."""
        async with aclosing(self.batches(body, bounded=bounded, hold=hold)) as batches:
            async for items in batches:
                for item in items:
                    yield item

    async def batches(
        self, body: Body, *, bounded: bool = True, hold: bool = False, sink: Sink | None = None
    ) -> AsyncGenerator[list[Event], None]:
        """As `stream`, but every event that has arrived by the caller's turn comes in one list (never
        empty): a caller that answers them with one message costs the event loop one turn for all.
        With a `sink` the events go to it as they arrive (jobs.put_all) and none is yielded: the
        generator only waits for the end."""
        job = self.submit(body, bounded=bounded, hold=hold, sink=sink)
        events = job.events
        try:
            while True:
                items = [await events.get()]
                while not events.empty():
                    items.append(events.get_nowait())
                end = items[-1]  # End is the last item a job ever delivers
                if not isinstance(end, End):
                    yield cast(list[Event], items)  # an End comes only last
                    continue
                if len(items) > 1:
                    yield cast(list[Event], items[:-1])
                if end.error is not None:
                    raise end.error
                return
        finally:
            job.cancel(Cancelled("the call ended before its job"))

    async def call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the worker (between two steps) and return its result: for tests and tools."""

        def body() -> Body:
            yield Result((yield from ask(Call(fn))))

        return cast(T, await self.result(body()))

    async def open_session(self, scope: str = "") -> Any:
        """A new engine session, once a KV slot is free (waiting in the bounded queue meanwhile)."""

        def body() -> Body:
            sessions = yield from ask(Open(scope=scope))
            yield Result(sessions[0])

        return await self.result(body(), bounded=True)

    async def run(self, request: Request[T]) -> T:
        """What the engine answers one request (a session operation) with."""

        def body() -> Body:
            yield Result((yield from ask(request)))

        return cast(T, await self.result(body()))

    async def result(self, body: Body, *, bounded: bool = False) -> Any:
        """Run `body`, which yields its answer as `Result(value)`, and return that value."""
        async for item in self.stream(body, bounded=bounded):
            if isinstance(item, Result):
                return item.value
        raise AssertionError("a call job always yields its result")
