"""Handing a step's results back to the jobs that asked for them.

The scheduler (service/worker/scheduler.py) runs a round's steps; `Answers` reads each `StepResult` and
answers the jobs waiting on its items, in the order they asked: session operations (with the
engine's seconds for a `Timed` one), opens (a `Lend`'s sessions stay the job's), prefill forwards
and decode rows. A parked session waiting for a row, or an open that found no slot, is left
unanswered: the job asks again next round. A prefill or decode forward that ran is reported
(`forward_done`: the metrics and a debug line).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from engine.errors import Exhausted, NoFreeRow, ParkingFull
from engine.executor.step import Outcome, StepResult
from service.worker.jobs import Job
from service.worker.rounds import Lend, Spare, Timed, Token, Tokens, decode_rows

ForwardDone = Callable[[str, float, Callable[[], dict[str, Any]]], None]  # kind, seconds, debug detail


def _prefill_detail(job: Job, outcome: Outcome) -> dict[str, Any]:
    """The debug line's detail of the prefill forward `job` just ran."""
    report = outcome.value.report
    return {
        "request_id": job.request_id,
        "width": report.width,
        "rows": report.forward.rows,
        "past": report.forward.past,
    }


def _no_slot(error: BaseException | None) -> bool:
    """An open or fork that found no slot this round (one counted as freed was not): it waits."""
    return isinstance(error, Exhausted) and not isinstance(error, ParkingFull)


class Answers:
    def __init__(self, fault: Callable[[BaseException], None], forward_done: ForwardDone) -> None:
        self._fault = fault  # every error answered goes to it (the scheduler reports engine faults)
        self._forward_done = forward_done

    def answer(self, job: Job, outcome: Outcome) -> None:
        if isinstance(outcome.error, NoFreeRow):
            return  # its parked session waits for a slot: the request runs again next round
        if outcome.error is not None:
            self._fault(outcome.error)
        job.answer(outcome.value, outcome.error)

    def ops(self, jobs: list[Job], result: StepResult, skip: int) -> None:
        """The session operations' jobs (the step's first `skip` ops were closes nobody waits on)."""
        end = skip + len(jobs)
        outcomes, seconds_each = result.ops[skip:end], result.op_seconds[skip:end]
        for job, outcome, seconds in zip(jobs, outcomes, seconds_each, strict=True):
            if isinstance(job.want, Timed) and outcome.error is None:
                outcome = Outcome((outcome.value, seconds))
            self.answer(job, outcome)

    def opens(self, jobs: list[Job], result: StepResult) -> None:
        for job, outcome in zip(jobs, result.opens, strict=True):
            if _no_slot(outcome.error):
                continue  # a slot counted as freed this round was not: it waits for the next
            lend = isinstance(job.want, Lend)
            self.answer(job, outcome)
            if outcome.error is None and lend:
                job.lent = list(outcome.value)
                job.slots = len(job.lent)

    def spares(self, jobs: list[tuple[Job, int]], result: StepResult, start: int) -> None:
        """The jobs whose `Spare` forked (job, forks asked), from the step's op `start` on: each gets
        the forks made, lent to it. A waiting one that got none stays in the queue; a fork that
        failed otherwise than for want of a slot fails the job when it got none."""
        at = start
        for job, count in jobs:
            outcomes, at = result.ops[at : at + count], at + count
            made = [o.value for o in outcomes if o.error is None]
            job.lent.extend(made)
            job.slots = len(job.lent)
            failed = next((o.error for o in outcomes if o.error is not None and not _no_slot(o.error)), None)
            if failed is not None:
                self._fault(failed)
            if made or failed is None:
                if made or not (isinstance(job.want, Spare) and job.want.wait):
                    job.answer(made)
            else:
                job.answer(error=failed)

    def prefills(self, jobs: list[Job], result: StepResult) -> tuple[tuple[int, int], ...]:
        """Answer the prefill jobs; (job, forward width) of each, 0 where none ran."""
        ran = []
        for job, outcome, seconds in zip(jobs, result.prefills, result.prefill_seconds, strict=True):
            self.answer(job, outcome)
            report = outcome.value.report if outcome.error is None else None
            if report is not None:
                self._forward_done("prefill", seconds, functools.partial(_prefill_detail, job, outcome))
            ran.append((job.serial, report.width if report is not None else 0))
        return tuple(ran)

    def decode(self, jobs: list[Job], result: StepResult) -> tuple[tuple[int, int], ...]:
        """Answer the decode jobs, whose rows the step ran in their order (`decode_rows` of each
        one's request); (job, pool row) of each row. A job whose row failed gets that row's error."""
        outcomes = result.decode
        record: list[tuple[int, int]] = []
        at = 0
        for job in jobs:
            want = job.want
            if type(want) is Token:  # one row: its token or its error
                outcome = outcomes[at]
                at += 1
                record.append((job.serial, want.row.session.row))
                if outcome.error is None:
                    job.answer(outcome.value)
                else:
                    self.answer(job, outcome)
                continue
            rows = decode_rows(want)
            mine = outcomes[at : at + len(rows)]
            at += len(rows)
            record.extend((job.serial, r.session.row) for r in rows)
            error = next((o.error for o in mine if o.error is not None), None)
            if error is not None:
                self.answer(job, Outcome(error=error))
            else:
                tokens = [o.value for o in mine]
                job.answer(tokens if isinstance(want, Tokens) else tokens[0])
        if result.batch:
            self._forward_done(
                "decode",
                result.decode_seconds,
                lambda: {
                    "rows": len(result.decode),
                    "batch": result.batch,
                    "request_ids": [j.request_id for j in jobs],
                },
            )
        return tuple(record)
