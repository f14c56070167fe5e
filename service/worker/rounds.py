"""What a round is made of, as pure values the scheduler (service/worker/scheduler.py) acts on: what a job
asks for beyond the engine's own step requests (engine/executor/step.py), which jobs get free KV
slots, what the running jobs wait on (`wants_of`), how many prefill forwards of which span a round
runs, and the record of what it ran."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field
from typing import TypeVar, cast

from engine.executor.session import Session
from engine.executor.step import (
    SESSION_OPS,
    DecodeRow,
    Open,
    Prefill,
    Request,
    SessionOp,
    T_co,
    Verified,
)
from service.worker.jobs import Item, Job

T = TypeVar("T")
Want = Request[object] | None  # what a job waits on: the request it yielded last, until answered


@dataclass(frozen=True)
class Call(Request[T_co]):
    """Run `fn` on the worker now, between two steps; its result (or error) goes back to the job.
    For tests and tools only: a job asks the engine for work with the engine's step requests."""

    fn: Callable[[], T_co]


@dataclass(frozen=True)
class Lend(Request[list[Session]]):
    """Wait, in arrival order, for the free KV slots `open` asks for; the sessions come back and are
    the job's until it ends: the scheduler closes them then, however it ends (a Generate's samples).
    A plain `Open` hands its sessions to the job's caller, who closes them.

    `fan`: the samples of one prompt (service/worker/samples.py), which start as slots free: granted as
    soon as one slot is free, it takes as many of `open.count` as are free once the requests
    granted beside it have theirs (`grant_sizes`); fewer sessions than asked may come back."""

    open: Open
    fan: bool = False


@dataclass(frozen=True)
class Spare(Request[list[Session]]):
    """Copies of `source` (a prompt's holder: its KV rows and next-token logits, `Fork`) on up to
    `count` free KV slots, lent to the job as `Lend`'s sessions are, after closing the lent
    sessions in `release` (samples that ended): the forks come back, a list.

    Without `wait` it is answered in the round's first step with what the slots left free after
    the queue's turn allow (often none), so the job's running samples decode in the same round;
    with `wait` (the job has nothing else running) it waits in the queue, in arrival order, for
    at least one."""

    source: Session | None  # None: only `release` (every sample has started)
    count: int
    release: tuple[Session, ...] = ()
    wait: bool = False


@dataclass(frozen=True)
class Verdict(Request[None]):
    """Wait until the call has judged the text of a token the job emitted (`judged()`: passed, or
    cut at a stop string, service/front/texts.py); None comes back, in the first round after. The call
    wakes the worker when its verdict lands on a job that waits."""

    judged: Callable[[], bool]


@dataclass(frozen=True)
class Timed(Request[tuple[T_co, float]]):
    """Run the session operation `op`; `(value, seconds the engine spent on it)` comes back."""

    op: Request[T_co]  # one of SESSION_OPS


@dataclass(frozen=True)
class Token(Request[int]):
    """Be one row of the round's decode forward; the chosen token (or None) comes back."""

    row: DecodeRow


@dataclass(frozen=True)
class Tokens(Request[list[int]]):
    """Be several rows of the round's decode forward (a request's n samples); their tokens come back."""

    rows: tuple[DecodeRow, ...]


@dataclass(frozen=True)
class Feed(Request[None]):
    """Be a feed-only row of the round's decode forward (`row.sampler` None: its token is fed and
    none is chosen); None comes back."""

    row: DecodeRow


@dataclass(frozen=True)
class Draft(Request[Verified]):
    """Be a drafted row of the round (`row.drafts` set): verified in a forward of its own when it
    decodes alone, else a plain row of the decode forward; its `Verified` tokens come back."""

    row: DecodeRow


DECODE_REQUESTS = (Token, Tokens, Feed, Draft)


def decode_rows(want: Want) -> tuple[DecodeRow, ...]:
    """The decode rows a job waits on (none unless it waits on Token, Tokens, Feed or Draft)."""
    if isinstance(want, Token | Feed | Draft):
        return (want.row,)
    return want.rows if isinstance(want, Tokens) else ()


# -- asking: what a job body yields, typed by what comes back ---------------------------------------

Asked = Generator[Item, object, T]  # a job body's part that asks one request and returns its reply


def ask(request: Request[T]) -> Asked[T]:
    """Ask the scheduler for `request` and return what it answers, typed by the request's class
    (`Request[T]`: the engine's step requests document their values, engine/executor/step.py). A
    job body writes `sessions = yield from ask(Lend(Open(...)))`; mypy checks every use of a reply."""
    reply = yield request
    return cast(T, reply)  # the scheduler answers each request with what its class says


def opening(want: Want) -> Open | None:
    """The sessions a job waits for (None unless it waits on Open or Lend)."""
    if isinstance(want, Lend):
        return want.open
    return want if isinstance(want, Open) else None


def slot_need(want: Want) -> tuple[int, int] | None:
    """The KV slots a job waits for in the queue, as (least, most) it starts with; None when it
    does not wait for slots (a `Spare` without `wait` is answered in the round)."""
    if isinstance(want, Lend):
        return (1 if want.fan else want.open.count, want.open.count)
    if isinstance(want, Open):
        return (want.count, want.count)
    if isinstance(want, Spare) and want.wait:
        return (1, want.count)
    return None


def session_op(want: Want) -> SessionOp | None:
    """The session operation a job waits on (None unless it waits on one)."""
    op = want.op if isinstance(want, Timed) else want
    return op if isinstance(op, SESSION_OPS) else None


@dataclass(frozen=True)
class StepRecord:
    """What one round ran: jobs closed before it, its prefill forwards (job, width), its decode
    rows (job, pool row), the decode forward's batch width, the session operations it ran and
    the batched choices of first tokens it made (one for every first token of the round)."""

    round: int
    closed: tuple[int, ...]
    prefill: tuple[tuple[int, int], ...]
    decode: tuple[tuple[int, int], ...]
    batch: int
    ops: int = 0
    choices: int = 0


def grant_sizes(granted: Iterable[tuple[int, int]], free: int) -> tuple[int, ...]:
    """How many of `free` KV slots each granted request, (least, most) in arrival order, takes:
    every one its least (`slot_grants` saw that they fit), then what is left, oldest first, up to
    each one's most. So a one-sample request granted beside a large `n` gets its slot, and the
    samples' extra slots are whatever nobody granted needed."""
    granted = list(granted)
    left = free - sum(least for least, _ in granted)
    sizes = []
    for least, most in granted:
        extra = min(most - least, max(left, 0))
        left -= extra
        sizes.append(least + extra)
    return tuple(sizes)


MAX_PREFILLS_PER_ROUND = 4


def prefill_plan(waiting: int, decoding: bool, shared_span: int, prompt_batch: int = 1) -> tuple[int, ...]:
    """The span of each prefill forward a round runs (0 = a whole chunk), for the oldest jobs first.

    Nothing decoding: a whole chunk for as many prompts as one forward may take (`prompt_batch`,
    1 where each prefills alone; the engine runs new prompts' first chunks of one width together).
    Streams decoding and one prompt waiting: one forward of `shared_span` rows (a ladder rung
    below the chunk), so those streams wait little between tokens. Several prompts waiting (a
    burst): a whole chunk for each of up to MAX_PREFILLS_PER_ROUND of them, or `prompt_batch`
    where more share a forward, so their first tokens do not queue behind each other.
    """
    if waiting == 0:
        return ()
    if not decoding:
        return (0,) * min(waiting, max(prompt_batch, 1))
    if waiting == 1:
        return (shared_span,)
    return (0,) * min(waiting, max(MAX_PREFILLS_PER_ROUND, prompt_batch))


def slot_grants(needs: Iterable[int], free: int, returning: int) -> tuple[int, ...]:
    """Which of the requests waiting for KV slots (`needs[i]` slots each, in arrival order) get
    them now: `free` slots are free and `returning` are held by running jobs that give them back
    when they end (a Generate's samples; not sessions, which stay until closed).

    Oldest first. A request that does not fit in the free slots but would once running jobs end
    holds the line: nothing behind it starts, so it starts as soon as they end (no starvation).
    A request that would not fit even then waits for sessions to close, which may take as long as
    their idle expiry: later requests that fit go ahead of it meanwhile (no head-of-line blocking),
    and their slots count as returning, so the line closes behind it once it can be served.
    `needs` is read from its head and no further than that: lazily, up to where the line holds
    or no slot is left.
    """
    granted = []
    for i, need in enumerate(needs):
        if free <= 0:
            break
        if need <= free:
            granted.append(i)
            free, returning = free - need, returning + need
        elif need <= free + returning:
            break
    return tuple(granted)


@dataclass
class Wants:
    """The running jobs waiting on each kind of request, each list in arrival order, and the KV
    slots they will give back when they end."""

    ops: list[Job] = field(default_factory=list)
    prefills: list[Job] = field(default_factory=list)
    decodes: list[Job] = field(default_factory=list)
    spares: list[Job] = field(default_factory=list)  # running jobs whose samples ask for slots
    rows: list[DecodeRow] = field(default_factory=list)  # the decode jobs' rows, in their order
    returning: int = 0


def wants_of(running: Iterable[Job]) -> Wants:
    """What every running job waits on, in one pass over them (the queue waiting for slots is not
    walked: `granted` reads its head), and the decode forward's rows in their order."""
    wants = Wants()
    decodes, rows, returning = wants.decodes, wants.rows, 0
    for job in running:  # in arrival order
        returning += job.slots
        want = job.want
        if want is None:
            continue
        if type(want) is Token:  # most jobs, most rounds: one row each
            decodes.append(job)
            rows.append(want.row)
        elif isinstance(want, DECODE_REQUESTS):
            decodes.append(job)
            rows.extend(decode_rows(want))
        elif isinstance(want, Prefill):
            wants.prefills.append(job)
        elif session_op(want) is not None:
            wants.ops.append(job)
        elif isinstance(want, Spare):
            wants.spares.append(job)
    wants.returning = returning
    return wants
