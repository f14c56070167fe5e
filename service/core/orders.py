"""The core's orders and what comes back (issue #42: the cut at the token level): the contract
between a frontend (the gRPC servicer, the HTTP app) and the core (service/core/core.py in process;
a transport between processes carries the same values).

A frontend turns a call into an order: token ids, sampling, stopping by ids and budgets, n,
log-probabilities, the constraint, the caller. The core answers with events (service/events.py:
token ids, no text; finish reasons; prefill forwards and shared rows) or a value. Text, stop
strings, protobuf and HTTP are the frontend's: it judges each token's text and sends its
verdicts (`Verdicts`: a stop string found cuts the sample; a kept session waits for them).

Orders and answers are frozen values that pickle as they are; `VERSION` is what a transport's
two ends agree on. `CoreApi` is what a frontend holds: the in-process `Core`, or a transport's.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

from engine.executor.stats import EngineStats
from engine.sampling import SamplingParams
from service.calls import ConstraintSpec, LogprobRequest, Stopping
from service.core.counting import Totals
from service.events import PrefillFinished
from service.worker.jobs import Event

VERSION = 1  # of the orders and events below: a transport's two ends must agree on it


@dataclass(frozen=True)
class GenerateOrder:
    """Generate n samples of a prompt given as token ids. `stopping` is budgeted already (the
    frontend knows the capacity); its stop strings are the frontend's to find (`watching`)."""

    tokens: tuple[int, ...]
    sampling: SamplingParams
    stopping: Stopping
    n: int = 1
    logprobs: LogprobRequest | None = None
    constraint: ConstraintSpec | None = None
    speculate: bool = True
    caller: str = ""
    request_id: str = ""  # the call's, on the core's log lines
    watching: bool = False  # the frontend looks for stop strings: its verdicts may cut samples
    unary: bool = False  # the frontend answers once, at the end: events may wait for it

    @property
    def prompt_top(self) -> int | None:
        """Alternatives per prompt token when the prompt's log-probabilities are asked for, else None."""
        return self.logprobs.top if self.logprobs is not None and self.logprobs.prompt else None


@dataclass(frozen=True)
class DecodeOrder:
    """Continue a session. `stopping` is budgeted on the worker, against the session's length."""

    session_id: str
    sampling: SamplingParams
    stopping: Stopping
    logprobs: LogprobRequest | None = None
    constraint: ConstraintSpec | None = None
    speculate: bool = True
    caller: str = ""
    request_id: str = ""  # the call's, on the core's log lines
    watching: bool = False


@dataclass(frozen=True)
class PrefillOrder:
    """Open a session ("" session_id) or extend the caller's own, for a Prefill's parts."""

    session_id: str
    sampling: SamplingParams  # the next token's, which PrefillDone previews
    caller: str = ""
    request_id: str = ""  # the call's, on the core's log lines


@dataclass(frozen=True)
class RewindOrder:
    session_id: str
    length: int
    caller: str = ""
    request_id: str = ""  # the call's, on the core's log lines


@dataclass(frozen=True)
class CloseOrder:
    session_id: str
    caller: str = ""
    request_id: str = ""  # the call's, on the core's log lines


@dataclass(frozen=True)
class ForkOrder:
    """A new session holding the first `length` tokens (None: all) of the caller's session, named
    by `fork_id` when given (a retry of a named fork is answered with the fork made first)."""

    session_id: str
    length: int | None = None
    fork_id: str = ""
    caller: str = ""
    request_id: str = ""  # the call's, on the core's log lines


@dataclass(frozen=True)
class ForkDone:
    """A fork made (or, `retry`, the one a named fork's first call made). Until the frontend says
    whether its client took it (`Core.fork_taken`), a retry of the same name waits for that."""

    session_id: str
    length: int
    source_session_id: str
    server_ms: float
    retry: bool = False


@dataclass(frozen=True)
class StatsDone:
    """The engine's counters and the worker's queue, for GetEngineStats."""

    stats: EngineStats
    depth: int
    waiting: int
    totals: Totals
    parking: bool


class Verdicts(Protocol):
    """Where a frontend's verdicts on a sample's tokens go: `passes` (no stop string up to this
    token), `stops` (a stop string ends at it: the sample is cut there)."""

    def passes(self, sample: int, index: int) -> None: ...

    def stops(self, sample: int, index: int) -> None: ...


class CoreCall:
    """One order in flight: its events in lists (`events`), and where the frontend's verdicts on
    the tokens' text go (`verdicts`; ignored unless the order was `watching`)."""

    def __init__(self, events: AsyncGenerator[list[Event], None], verdicts: Verdicts) -> None:
        self.events = events
        self.verdicts = verdicts


class PrefillHandle(Protocol):
    """A Prefill's session on the core, held for the call: parts appended, the next token
    previewed, the extension kept only once the frontend says so (else undone at the end)."""

    @property
    def session_id(self) -> str: ...

    def part(self, tokens: list[int]) -> AsyncGenerator[list[Event], None]: ...

    async def peek(self) -> PrefillFinished: ...

    def keep(self) -> None: ...


class CoreApi(Protocol):
    """What a frontend asks of the core."""

    def generate(self, order: GenerateOrder) -> CoreCall: ...

    def decode(self, order: DecodeOrder) -> CoreCall: ...

    def prefill(self, order: PrefillOrder) -> AbstractAsyncContextManager[PrefillHandle]: ...

    async def rewind(self, order: RewindOrder) -> int: ...

    async def close(self, order: CloseOrder) -> int: ...

    async def fork(self, order: ForkOrder) -> ForkDone: ...

    def fork_taken(self, done: ForkDone, taken: bool) -> None: ...

    async def stats(self) -> StatsDone: ...
