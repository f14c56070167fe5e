"""One step of the engine: what a scheduler round asks of it, as one typed value, and what came of it.

The scheduler (service/worker/scheduler.py) gathers its jobs' requests into a `Step` and the engine
runs it (`Engine.step`), in this order:

1. `ops`: session operations (close, fork, rewind, reset, stats), in the order given (a slot a
   close frees is free for the opens);
2. `opens`: sessions on free KV slots, each starting from the longest held prefix of its prompt;
3. `prefills`: one prefill forward each (the first one of a prompt also takes its shared
   prefix and plans it), batchable new prompts' first chunks of one width in one forward
   together; a prompt whose last forward ran is copied into its `copies`;
4. one batched choice of every first token: each `Choose` (from the logits a session holds)
   and each prefill that just finished with samplers (its session's and its copies');
5. `decode`: one forward for every row, which chooses the next tokens in the same batch.

Each item succeeds or fails alone (`Outcome`): a bad request fails its own job, not the
step, except a fault of the forward every decode row rides in, which fails them all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from engine.executor.facts import EngineFacts
from engine.executor.prefill import ForwardReport, PrefillTask
from engine.executor.session import Session
from engine.executor.stats import EngineStats
from engine.planner.drafts import Costs
from engine.sampling import Sampler, TokenLogprobs

T_co = TypeVar("T_co", covariant=True)


class Request(Generic[T_co]):
    """What a job may ask the worker for, answered with a `T_co`: the type parameter says what
    comes back, so `ask` (service/worker/rounds.py) returns it typed and mypy checks every use."""

    __slots__ = ()


@dataclass(frozen=True)
class Open(Request[list[Session]]):
    """`count` sessions on free KV slots; the first holds the longest prefix of `prompt` held for
    `scope` (its `length` says how many tokens), the rest start empty. The value: a list of sessions."""

    prompt: tuple[int, ...] = ()
    scope: str = ""
    count: int = 1


@dataclass(frozen=True)
class Prefill(Request["PrefillProgress"]):
    """Append `tokens` to `session`, one forward per step. The first step takes the longest held
    prefix first (`share`: an empty session only) and plans the rest; later steps carry the
    `task` the first one returned. After the last forward the session is copied into each of
    `copies` and, given `samplers` (one for the session, one per copy, then any more: each chooses
    from the session's logits too), the first tokens are chosen in the step's batched choice. The
    value: a `PrefillProgress`."""

    session: Session
    tokens: tuple[int, ...] = ()
    share: bool = False
    logprob_top: int | None = None
    copies: tuple[Session, ...] = ()
    samplers: tuple[Sampler, ...] = ()
    task: PrefillTask | None = None
    # The first chunk may run in one forward with other new prompts of the step (a Generate's own
    # session, which ends with the request): its rows are then not a fresh run's, so they are
    # never shared as a held prefix and an append to the session would re-run them.
    batchable: bool = False


@dataclass(frozen=True)
class PrefillProgress:
    """A prefill step's outcome: the task (carry it into the next `Prefill`), the forward that ran
    (None when the whole prompt was shared), the prefix rows it shared, and, once the task is done
    and samplers were given, the first tokens (the session's, then each copy's)."""

    task: PrefillTask
    report: ForwardReport | None
    shared: int = 0
    tokens: tuple[int, ...] = ()

    @property
    def done(self) -> bool:
        return self.task.done


@dataclass(frozen=True)
class Choose(Request[int]):
    """Choose the next token from the logits `session` holds (no forward). The value: the token."""

    session: Session
    sampler: Sampler


@dataclass(frozen=True)
class Fork(Request[Session]):
    """A new session holding a copy of `source`'s first `length` tokens (None: all). The value:
    the new session."""

    source: Session
    length: int | None = None


@dataclass(frozen=True)
class Rewind(Request[int]):
    """Keep the first `length` tokens of `session`; its logits follow. The value: the new length."""

    session: Session
    length: int


@dataclass(frozen=True)
class Reset(Request[None]):
    """Make `session` hold exactly `tokens`, with their logits (an unfinished extension undone)."""

    session: Session
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class Close(Request[int]):
    """Return the session's KV slot (with `keep`, its rows stay as a held prefix). The value: the
    tokens it held."""

    session: Session
    keep: bool = True


@dataclass(frozen=True)
class Stats(Request[EngineStats]):
    """The engine's counters (engine.executor.stats.EngineStats)."""


SessionOp = Fork | Rewind | Reset | Close | Choose | Stats
SESSION_OPS = (Fork, Rewind, Reset, Close, Choose, Stats)


@dataclass(frozen=True)
class DecodeRow:
    """One session's part of a decode step: feed `token`, then choose the next with `sampler`."""

    session: Session
    token: int
    sampler: Sampler | None = None  # None: feed only (the next token is chosen later, or never)
    # Whether the token chosen here will be fed in a next step. False (it is the request's last):
    # no forward is launched ahead on it, which would only delay the request's end by one forward.
    more: bool = True
    # Speculation (issue #44): tokens that may follow `token` (a prompt-lookup draft). The row then
    # runs `token` and its draft in one verification forward and chooses from each row in turn,
    # keeping the draft's tokens for as long as the choice equals them: the value is `Verified`.
    # Acceptance also ends after a token in `stops` (end of sequence, stop ids), so the session
    # never holds a token past one its request stops at.
    drafts: tuple[int, ...] = ()
    stops: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Verified:
    """A drafted decode row's outcome: the tokens chosen (1 to drafts + 1; every one but the last
    fed, as a decode row's one token is not), their log-probabilities where the sampler asks,
    and how many drafted tokens the forward checked (0: it ran as a plain decode row)."""

    tokens: tuple[int, ...]
    logprobs: tuple[TokenLogprobs | None, ...]
    drafted: int

    @property
    def accepted(self) -> int:
        return len(self.tokens) - 1


@dataclass(frozen=True)
class Step:
    """What one round asks of the engine. `prefills` pairs each request with its span: at most
    that many real rows (0: a whole chunk)."""

    opens: tuple[Open, ...] = ()
    ops: tuple[SessionOp, ...] = ()
    prefills: tuple[tuple[Prefill, int], ...] = ()
    decode: tuple[DecodeRow, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.opens or self.ops or self.prefills or self.decode)

    def sessions(self) -> set[Session]:
        """Every session an item of the step names (a Fork's source, a Prefill's copies included)."""
        named: set[Session] = set()
        for op in self.ops:
            if isinstance(op, Fork):
                named.add(op.source)
            elif not isinstance(op, Stats):
                named.add(op.session)
        for request, _ in self.prefills:
            named.update((request.session, *request.copies))
        named.update(row.session for row in self.decode)
        return named


@dataclass(frozen=True)
class Outcome:
    """One item's result: its value, or the error it failed with."""

    value: Any = None
    error: BaseException | None = None

    def get(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


@dataclass(frozen=True)
class StepResult:
    """One outcome per item of the step, in its order, and how long the forwards took."""

    opens: tuple[Outcome, ...] = ()
    ops: tuple[Outcome, ...] = ()
    op_seconds: tuple[float, ...] = ()  # per session operation (a choice's is in the batched choice)
    prefills: tuple[Outcome, ...] = ()
    decode: tuple[Outcome, ...] = ()
    batch: int = 0  # the decode forward's batch width (0: none ran)
    prefill_seconds: tuple[float, ...] = ()  # per prefill item (0.0 where it failed)
    decode_seconds: float = 0.0
    choices: int = 0  # batched choices made for first tokens (0 or 1)


@dataclass
class _Chosen:
    """The step's first-token choice, gathered as the step runs."""

    sessions: list[Session] = field(default_factory=list)
    samplers: list[Sampler] = field(default_factory=list)
    owners: list[tuple[str, int]] = field(default_factory=list)  # ("op"|"prefill", item index)

    def add(self, owner: tuple[str, int], sessions: Sequence[Session], samplers: Sequence[Sampler]) -> None:
        self.sessions.extend(sessions)
        self.samplers.extend(samplers)
        self.owners.extend([owner] * len(sessions))


class Driven(Protocol):
    """An engine as the product drives it (service/: the scheduler's worker, the served model, the
    metrics): steps, and the counts other threads may read (ints the worker keeps). Only what
    builds an engine (service/loading.py) holds the `Engine` class itself."""

    facts: EngineFacts

    @property
    def costs(self) -> Costs:
        """What a lone stream's step and a verification forward take, as the engine runs."""
        ...

    def step(self, step: Step) -> StepResult: ...

    def before_forward(self, hook: Callable[[], None] | None) -> None:
        """Call `hook` (on the stepping thread) just before each forward enters onnxruntime, which
        runs without the interpreter: work handed to other threads there overlaps the forward."""
        ...

    @property
    def free_slots(self) -> int: ...

    @property
    def rows_held(self) -> int: ...

    @property
    def shared_span(self) -> int: ...

    @property
    def last_batch(self) -> int: ...

    def parked_size(self, length: int) -> int: ...
