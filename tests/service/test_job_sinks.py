"""A job whose events go to a sink (the core's link, service/core/core_link.py) instead of its
queue: the events of one round reach the sink in order and in one list, before the job's End
reaches its queue, and a job without a sink is served as before."""

from __future__ import annotations

import asyncio

from service.worker.jobs import Body, Delivered, End, Event, Job, Result, put_all


def _job(serial: int, sink: list[tuple[list[Event], int]] | None = None) -> Job:
    def body() -> Body:
        yield from ()

    loop = asyncio.new_event_loop()
    loop.close()  # put_all runs on the loop's thread: the job only names its loop
    job = Job(body(), loop, False, serial, lambda _: None, lambda _j, _i: None)
    if sink is not None:
        job.sink = lambda events: sink.append((list(events), job.events.qsize()))
    return job


def _queued(job: Job) -> list[Delivered]:
    return [job.events.get_nowait() for _ in range(job.events.qsize())]


def test_a_sink_takes_a_rounds_events_in_one_list_before_its_end_is_queued() -> None:
    taken: list[tuple[list[Event], int]] = []
    sunk, plain = _job(0, taken), _job(1)
    put_all([(sunk, Result(1)), (plain, Result(9)), (sunk, Result(2)), (sunk, End())])
    assert taken == [([Result(1), Result(2)], 0)]  # one list, and the queue still empty then
    assert _queued(sunk) == [End()]
    assert _queued(plain) == [Result(9)]


def test_a_sink_takes_each_rounds_events_as_they_come() -> None:
    taken: list[tuple[list[Event], int]] = []
    job = _job(0, taken)
    put_all([(job, Result(1))])
    put_all([(job, Result(2)), (job, Result(3))])
    put_all([(job, End(ValueError("x")))])
    assert [events for events, _ in taken] == [[Result(1)], [Result(2), Result(3)]]
    (end,) = _queued(job)
    assert isinstance(end, End) and isinstance(end.error, ValueError)
