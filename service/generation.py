"""What a request asks the engine for, checked, and the job bodies the worker runs.

The servicer turns protobuf into the plain values here (Prompt input, Stopping,
SamplingParams); this module resolves prompts to token ids, enforces the
server's limits, and writes the worker-side generators: one forward per step,
one event per yield. It never sees protobuf and never touches tensors beyond
handing logits from the engine to the sampler.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from engine.errors import EngineError, OutOfRange
from engine.executor.sampling import Sampler, SamplingParams
from service.errors import InvalidRequest, LimitExceeded, NoTokenizer
from service.sessions import SessionState


class Finish(Enum):
    LENGTH = 1
    EOS = 2
    STOP = 3
    CAPACITY = 4


@dataclass(frozen=True)
class ChatTurn:
    role: str
    content: str


@dataclass(frozen=True)
class Stopping:
    max_new_tokens: int = 0  # 0 = as many as fit, up to the server's limit
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    stop_token_ids: frozenset[int] = frozenset()


@dataclass
class PrefillTally:
    forwards: int = 0
    real_rows: int = 0
    padded_rows: int = 0
    widths: list[int] = field(default_factory=list)


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
class TokenOut:
    id: int
    text: str
    index: int
    at: float


@dataclass(frozen=True)
class Finished:
    reason: Finish
    tail: str  # text held back until the end (a partial character, a possible stop prefix)
    session_length: int


@dataclass(frozen=True)
class PrefillFinished:
    length: int
    next_token: int
    next_text: str


class Model:
    """The loaded engine, its tokenizer (or None) and the server's limits."""

    def __init__(self, engine: Any, tokenizer: Any | None, name: str, max_prompt_tokens: int,
                 max_new_tokens: int) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.name = name
        self.capacity: int = engine.capacity
        self.vocab_size: int = engine.info.vocab_size
        self.eos_ids = frozenset(engine.info.eos_token_ids)
        self.max_prompt_tokens = max_prompt_tokens or self.capacity
        self.max_new_tokens = max_new_tokens

    def need_tokenizer(self, what: str) -> Any:
        if self.tokenizer is None:
            raise NoTokenizer(f"{what} needs a tokenizer and the model directory has none; send token ids")
        return self.tokenizer

    def prompt_ids(self, text: str | None, chat: Sequence[ChatTurn] | None,
                   ids: Sequence[int] | None) -> list[int]:
        """Token ids of a prompt given as text, chat turns or ids; checked against the limits."""
        if text is not None:
            tokens = [int(t) for t in self.need_tokenizer("a text prompt").encode(text)]
        elif chat is not None:
            tokenizer = self.need_tokenizer("a chat prompt")
            if not chat:
                raise InvalidRequest("a chat prompt needs at least one message")
            from engine.tokenizer import ChatMessage

            tokens = [int(t) for t in tokenizer.encode_chat([ChatMessage(m.role, m.content) for m in chat])]
        else:
            tokens = [int(t) for t in ids or ()]
        return self.check_ids(tokens)

    def check_ids(self, tokens: list[int]) -> list[int]:
        if not tokens:
            raise InvalidRequest("the prompt is empty")
        bad = next((t for t in tokens if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidRequest(f"token id {bad} is outside the vocabulary of {self.vocab_size}")
        if len(tokens) > self.max_prompt_tokens:
            raise LimitExceeded(f"the prompt has {len(tokens)} tokens; the limit is {self.max_prompt_tokens}")
        return tokens

    def budget(self, stopping: Stopping, past: int) -> Stopping:
        """Resolve max_new_tokens against the limit and the room left after `past` tokens."""
        room = self.capacity - past
        wanted = stopping.max_new_tokens
        if wanted > self.max_new_tokens:
            raise LimitExceeded(f"max_new_tokens {wanted} is over the limit of {self.max_new_tokens}")
        if wanted == 0:
            wanted = min(self.max_new_tokens, room)
        if wanted < 1 or wanted > room:
            raise OutOfRange(f"{past} prompt tokens + {wanted} new tokens exceed the KV capacity "
                             f"of {self.capacity}")
        if stopping.stop:
            self.need_tokenizer("stop sequences")
        return Stopping(wanted, stopping.stop, stopping.ignore_eos, stopping.stop_token_ids)


def check_sampling(params: SamplingParams) -> SamplingParams:
    try:
        params.validate()
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from exc
    return params


class StopText:
    """Streams text while holding back any tail that could still begin a stop sequence."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.held = ""
        self.stopped = False

    def push(self, piece: str) -> str:
        text = self.held + piece
        for stop in self.stops:
            if (cut := text.find(stop)) >= 0:
                self.held, self.stopped = "", True
                return text[:cut]
        keep = max((n for s in self.stops for n in range(1, len(s)) if text.endswith(s[:n])), default=0)
        self.held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]


# -- worker-side bodies: every next() runs at most one forward -------------------------------------

def prefill_steps(session: Any, tokens: list[int], tally: PrefillTally) -> Generator[Any, None, Any]:
    """Run the prompt one forward per step; return the next-token logits."""
    logits = None
    for report in session.prefill(tokens):
        forward = report.forward
        tally.forwards += 1
        tally.real_rows += forward.rows
        tally.padded_rows += report.width - forward.rows
        tally.widths.append(report.width)
        logits = report.logits
        yield ForwardDone(forward.rows, report.width, forward.past, report.length)
    return logits


def decode_steps(model: Model, state: SessionState, sampler: Sampler, stopping: Stopping,
                 feed_last: bool) -> Generator[Any, None, None]:
    """Sample, emit and feed tokens from state.logits; every emitted token is fed when feed_last.

    After the first token the engine chooses where the logits live (session.next_token):
    on CUDA only token ids cross to the host. A persistent session cancelled mid-way
    gets its logits back for the tokens it holds, so it stays usable.
    """
    session = state.session
    first, state.logits = state.logits, None  # stale as soon as a token is fed
    assert first is not None, "decode starts from a session's next-token logits"
    stream = model.tokenizer.stream(skip_special=True) if model.tokenizer is not None else None
    stop_text = StopText(stopping.stop)
    reason, token, settled = Finish.LENGTH, -1, False
    try:
        for index in range(stopping.max_new_tokens):
            token = sampler(first, session.tokens) if index == 0 else session.next_token(sampler, [token])
            piece = stop_text.push(stream.push(token)) if stream is not None else ""
            yield TokenOut(token, piece, index, time.perf_counter())
            stopped = _stop_reason(model, stopping, token, stop_text)
            if stopped is not None or session.length + 1 > model.capacity:
                reason = stopped or Finish.CAPACITY
                break
        tail = "" if stop_text.stopped or stream is None else stop_text.push(stream.flush()) + stop_text.held
        if feed_last and session.length + 1 <= model.capacity:
            state.logits = session.append([token])
        settled = True
        yield Finished(reason, tail, session.length)
    finally:
        if feed_last and not settled and session.length and not session.closed:
            with contextlib.suppress(EngineError):
                state.logits = logits_after(session)


def logits_after(session: Any) -> np.ndarray:
    """The next-token logits of the tokens the session holds: its last token run again."""
    last = session.tokens[-1]
    session.rewind_to(session.length - 1)
    return np.asarray(session.append([last]))


def _stop_reason(model: Model, stopping: Stopping, token: int, stop_text: StopText) -> Finish | None:
    if token in model.eos_ids and not stopping.ignore_eos:
        return Finish.EOS
    if token in stopping.stop_token_ids or stop_text.stopped:
        return Finish.STOP
    return None


def generate_body(model: Model, tokens: list[int], sampler: Sampler, stopping: Stopping,
                  tally: PrefillTally) -> Generator[Any, None, None]:
    """Generate on a session of its own, returned to the pool however the job ends."""
    yield Started(time.perf_counter())
    session = model.engine.open_session()
    try:
        state = SessionState(id="", owner="", session=session)
        state.logits = yield from prefill_steps(session, tokens, tally)
        yield from decode_steps(model, state, sampler, stopping, feed_last=False)
    finally:
        session.close()


def prefill_body(model: Model, state: SessionState, tokens: list[int],
                 tally: PrefillTally) -> Generator[Any, None, None]:
    """Extend a session by one prompt part; its logits become the session's next-token logits."""
    state.logits = yield from prefill_steps(state.session, tokens, tally)


def decode_body(model: Model, state: SessionState, sampler: Sampler,
                stopping: Stopping) -> Generator[Any, None, None]:
    """Continue a session; checked on the worker, after any earlier job on it has ended."""
    yield Started(time.perf_counter())
    if state.logits is None:
        raise OutOfRange(f"session {state.id} has nothing to continue from (empty or full)")
    budget = model.budget(stopping, state.session.length)
    yield from decode_steps(model, state, sampler, budget, feed_last=True)


def close(state: SessionState) -> int:
    """Return the session's KV slot; the tokens it held."""
    length: int = state.session.length
    state.session.close()
    return length


def next_token(model: Model, state: SessionState, sampler: Sampler) -> PrefillFinished:
    """The token the sampler picks from the session's logits (not fed)."""
    if state.logits is None:
        raise OutOfRange("the session has no next-token logits (empty or full)")
    token = sampler(state.logits, state.session.tokens)
    text = model.tokenizer.decode([token]) if model.tokenizer is not None else ""
    return PrefillFinished(state.session.length, token, text)


def rewind(state: SessionState, length: int) -> int:
    """Keep the first `length` tokens; re-run the last kept one to recover its logits."""
    session = state.session
    if length > session.length:
        raise InvalidRequest(f"cannot rewind to {length}: the session holds {session.length}")
    if length == session.length:
        return length
    if length == 0:
        session.rewind_to(0)
        state.logits = None
        return 0
    session.rewind_to(length)
    state.logits = logits_after(session)
    return session.length
