"""Who gets KV slots in a round's first step, as pure-ish steps the scheduler (service/worker/scheduler.py)
runs: the queue's grants, oldest first (`rounds.slot_grants`, `rounds.grant_sizes`), then the
running samples' `Spare`s (forks of their prompt's session on the slots nobody waiting needs,
after closing the sessions of samples that ended).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from engine.executor import Session
from engine.executor.step import Close, Fork, Open
from service.worker.jobs import Job
from service.worker.rounds import Spare, grant_sizes, opening, slot_grants, slot_need


@dataclass
class SlotWork:
    """What a round's first step does with slots: the opens granted (`opens[i]` for
    `open_jobs[i]`), the `Spare`s' jobs with the forks each gets (none for some), and the
    ops for both: the sessions given back, then the forks."""

    open_jobs: list[Job] = field(default_factory=list)
    opens: list[Open] = field(default_factory=list)
    forking: list[tuple[Job, int]] = field(default_factory=list)
    releases: tuple[Close, ...] = ()
    forks: tuple[Fork, ...] = ()


def granted(queued: Sequence[Job], spares: Sequence[Job], free: int, returning: int) -> tuple[int, ...]:
    """Which jobs waiting for slots get some of `free` now: indices into `queued`, then into
    `spares` (the running jobs' samples asking for more). A running job's samples come after the
    queue: a request that has started goes on while new ones take their first slot."""
    needs = (slot_need(job.want)[0] for job in queued)  # type: ignore[index]
    more = (1 if spare(job).count else 0 for job in spares)
    return slot_grants(itertools.chain(needs, more), free, returning)


def slot_work(queued: Sequence[Job], spares: Sequence[Job], free: int, returning: int) -> SlotWork:
    """The round's slot work, `free` slots free once its other session operations have run."""
    work = SlotWork(releases=tuple(Close(session) for job in spares for session in released(job)))
    free = max(free + len(work.releases), 0)
    jobs = [
        queued[i] if i < len(queued) else spares[i - len(queued)]
        for i in granted(queued, spares, free, returning)
    ]
    needs = [slot_need(job.want) or (1, spare(job).count) for job in jobs]
    for job, size in zip(jobs, grant_sizes(needs, free), strict=True):
        if (open_ := opening(job.want)) is not None:
            work.open_jobs.append(job)
            work.opens.append(replace(open_, count=size))
        else:
            work.forking.append((job, size))
    work.forking += [(job, 0) for job in spares if all(job is not j for j, _ in work.forking)]
    work.forks = tuple(Fork(_holder(job)) for job, count in work.forking for _ in range(count))
    return work


def spare(job: Job) -> Spare:
    """The `Spare` a running job's samples wait on."""
    assert isinstance(job.want, Spare)
    return job.want


def _holder(job: Job) -> Session:
    """The session a `Spare` granted forks copies (one that asks for forks names its holder)."""
    source = spare(job).source
    assert source is not None, "a Spare granted forks has a holder to copy"
    return source


def released(job: Job) -> tuple[Session, ...]:
    """The lent sessions a job's `Spare` gives back: no longer the job's (closed in this step)."""
    sessions = spare(job).release
    for session in sessions:
        job.lent.remove(session)
    job.slots = len(job.lent)
    return sessions
