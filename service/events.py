"""What a job body yields for its caller: the events of one generation or prefill.

Plain values: the worker yields them, Progress (service/front/progress.py) folds them
into a call's record, and service/grpc/wire.py writes them as protobuf.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from engine.sampling import TokenLogprobs


class Finish(Enum):
    LENGTH = 1
    EOS = 2
    STOP = 3
    CAPACITY = 4


@dataclass
class PrefillTally:
    """A call's prefill, folded from its events (ForwardDone, Shared) where the call is answered."""

    forwards: int = 0
    real_rows: int = 0
    padded_rows: int = 0
    widths: list[int] = field(default_factory=list)
    shared_rows: int = 0  # prompt tokens copied from a held prefix instead of prefilled

    def forward(self, done: ForwardDone) -> None:
        self.forwards += 1
        self.real_rows += done.real_rows
        self.padded_rows += done.width - done.real_rows
        self.widths.append(done.width)


@dataclass(frozen=True)
class Started:
    at: float


@dataclass(frozen=True)
class ForwardDone:
    real_rows: int
    width: int
    past: int
    length: int


@dataclass(frozen=True)
class Shared:
    """Prompt rows taken from a held prefix instead of prefilled (PrefillTally.shared_rows)."""

    rows: int


@dataclass(frozen=True)
class TokenOut:
    id: int
    text: str
    index: int
    at: float
    logprobs: TokenLogprobs | None = None  # when the request asked for them
    sample: int = 0  # which of the request's n samples


@dataclass(frozen=True)
class Finished:
    reason: Finish
    tail: str  # text held back until the end (a partial character, a possible stop prefix)
    session_length: int
    sample: int = 0


@dataclass(frozen=True)
class PromptLogprobs:
    """The log-probabilities of the prompt's tokens after the first, from the prefill's logits."""

    logprobs: tuple[TokenLogprobs, ...]


@dataclass(frozen=True)
class PrefillFinished:
    length: int
    next_token: int
