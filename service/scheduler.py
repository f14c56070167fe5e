"""The engine worker: one thread owns the engine and runs every forward, one step at a time.

Contract: a job is a generator run on the worker thread; each `next()` runs at
most one forward (one prefill chunk or one decode token) and may yield one
event for its caller. The worker steps every live job once per round, so a long
prompt's prefill interleaves with the running streams: a stream waits at most
one forward of each other job between its tokens. Nothing else touches the engine.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from engine.errors import EngineFault
from service.errors import Cancelled, QueueFull

log = structlog.get_logger("ladder.scheduler")
T = TypeVar("T")
Body = Generator[Any, None, None]


@dataclass(frozen=True)
class _End:
    error: BaseException | None = None


class Job:
    """One request on the worker: its generator and the asyncio queue its events go to."""

    def __init__(self, body: Body, loop: asyncio.AbstractEventLoop, bounded: bool) -> None:
        self.body = body
        self.bounded = bounded  # counts toward the queue bound (requests, not internal calls)
        self.loop = loop
        self.events: asyncio.Queue[Any] = asyncio.Queue()
        self.abort_error: BaseException | None = None
        self.done = False

    def cancel(self, error: BaseException) -> None:
        """Stop the job before its next step (thread-safe; a finished job ignores it)."""
        if self.abort_error is None:
            self.abort_error = error

    def deliver(self, item: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:  # the event loop is gone: nobody is listening any more
            pass


class Scheduler:
    def __init__(self, max_queue: int, on_fault: Callable[[BaseException], None] | None = None) -> None:
        self.max_queue = max_queue
        self.on_fault = on_fault
        self._inbox: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._active: list[Job] = []
        self._lock = threading.Lock()
        self._depth = 0
        self._refusal: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ladder-engine", daemon=True)
        self._thread.start()

    @property
    def depth(self) -> int:
        """Requests the worker holds (running or about to start)."""
        return self._depth

    # -- the event-loop side ------------------------------------------------------
    def submit(self, body: Body, *, bounded: bool = True) -> Job:
        with self._lock:
            if self._refusal is not None:
                body.close()
                raise self._refusal
            if bounded and self._depth >= self.max_queue:
                body.close()
                raise QueueFull(f"the engine worker already holds {self._depth} requests")
            self._depth += bounded
        job = Job(body, asyncio.get_running_loop(), bounded)
        self._inbox.put(job)
        return job

    async def stream(self, body: Body, *, bounded: bool = True) -> AsyncIterator[Any]:
        """Run `body` on the worker and yield its events; leaving early cancels the job."""
        job = self.submit(body, bounded=bounded)
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
        """Run `fn` on the worker (one step) and return its result."""
        def body() -> Body:
            yield fn()

        job = self.submit(body(), bounded=False)
        item = await job.events.get()
        if isinstance(item, _End):
            raise item.error or AssertionError("a call job always yields its result")
        return item  # type: ignore[no-any-return]

    def abort_all(self, error: BaseException) -> None:
        """End every job before its next step with `error`, and refuse new ones (drain deadline)."""
        self._refusal = error
        for job in list(self._active):
            job.cancel(error)

    def stop(self) -> None:
        self._inbox.put(None)
        self._thread.join(timeout=10)

    # -- the worker thread ---------------------------------------------------------
    def _run(self) -> None:
        while True:
            if not self._admit(block=not self._active):
                return
            for job in list(self._active):
                self._step(job)

    def _admit(self, block: bool) -> bool:
        """Move new jobs into the round; False when told to stop."""
        try:
            item = self._inbox.get(block=block)
            while True:
                if item is None:
                    for job in list(self._active):
                        self._close(job, Cancelled("the server stopped"))
                    return False
                self._active.append(item)
                item = self._inbox.get_nowait()
        except queue.Empty:
            return True

    def _step(self, job: Job) -> None:
        if job.abort_error is not None:
            self._close(job, job.abort_error)
            return
        try:
            event = next(job.body)
        except StopIteration:
            self._finish(job, None)
        except Exception as exc:  # noqa: BLE001 — a failing job must never stop the worker
            if isinstance(exc, EngineFault) and self.on_fault is not None:
                self.on_fault(exc)
            self._finish(job, exc)
        else:
            if event is not None:
                job.deliver(event)

    def _close(self, job: Job, error: BaseException) -> None:
        """End a job early: its finally blocks run here (sessions it opened are closed)."""
        try:
            job.body.close()
        except Exception as exc:  # noqa: BLE001 — a failing clean-up must never stop the worker
            log.error("job_cleanup_failed", error=repr(exc))
        self._finish(job, error)

    def _finish(self, job: Job, error: BaseException | None) -> None:
        job.done = True
        self._active.remove(job)
        with self._lock:
            self._depth -= job.bounded
        job.deliver(_End(error))
