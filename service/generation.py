"""What a request asks the engine for, checked, and the job bodies the worker runs.

The servicer turns protobuf into the plain values here (Prompt input, Stopping,
SamplingParams); this module resolves prompts to token ids, enforces the
server's limits, and writes the worker-side generators, which yield events for
the caller and requests for the scheduler (a slot, a prefill chunk, a decode
row). It never sees protobuf and never touches tensors.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from engine.errors import OutOfRange
from engine.executor import DecodeRow
from engine.executor.sampling import MAX_TOP_LOGPROBS, Sampler, SamplingParams, TokenLogprobs
from service.errors import InvalidRequest, LimitExceeded, NoTokenizer
from service.requests import Call, Chunk, OpenSlot, Token, Tokens
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


MAX_STOPS = 16  # stop strings per request
MAX_STOP_CHARS = 512  # characters per stop string
PROMPT_BYTES_PER_TOKEN = 32  # text and chat prompts: UTF-8 bytes allowed per allowed prompt token
CHAT_TURN_BYTES = 32  # what each chat message counts beyond its role and content (the template's markup)


@dataclass(frozen=True)
class Stopping:
    max_new_tokens: int = 0  # 0 = the server's default (Model.default_new_tokens), as many as fit
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    stop_token_ids: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        """Bounded work per token: a few stop strings of bounded length."""
        if len(self.stop) > MAX_STOPS:
            raise InvalidRequest(f"{len(self.stop)} stop strings; at most {MAX_STOPS} are allowed",
                                 reason="TOO_MANY_STOPS", field="stopping.stop")
        longest = max((len(s) for s in self.stop), default=0)
        if longest > MAX_STOP_CHARS:
            raise InvalidRequest(f"a stop string of {longest} characters; the most is {MAX_STOP_CHARS}",
                                 reason="STOP_TOO_LONG", field="stopping.stop")


@dataclass
class PrefillTally:
    forwards: int = 0
    real_rows: int = 0
    padded_rows: int = 0
    widths: list[int] = field(default_factory=list)
    shared_rows: int = 0  # prompt tokens copied from a held prefix instead of prefilled


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
    next_text: str


class Model:
    """The loaded engine, its tokenizer (or None) and the server's limits."""

    def __init__(self, engine: Any, tokenizer: Any | None, name: str, max_prompt_tokens: int,
                 max_new_tokens: int, default_new_tokens: int = 0) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.name = name
        self.capacity: int = engine.capacity
        self.vocab_size: int = engine.info.vocab_size
        self.eos_ids = frozenset(engine.info.eos_token_ids)
        self.max_prompt_tokens = max_prompt_tokens or self.capacity
        self.max_new_tokens = max_new_tokens
        # What a request that names no max_new_tokens gets (0 configured: the limit), never over the limit.
        self.default_new_tokens = min(default_new_tokens or max_new_tokens, max_new_tokens)

    def token_text(self, token: int) -> str:
        """One token's own text, special tokens written out ("" without a tokenizer)."""
        return "" if self.tokenizer is None else str(self.tokenizer.decode([token], skip_special=False))

    def need_tokenizer(self, what: str) -> Any:
        if self.tokenizer is None:
            raise NoTokenizer(f"{what} needs a tokenizer and this model has none Ladder can read "
                              "(see the server's start-up log); send token ids")
        return self.tokenizer

    def prompt_ids(self, text: str | None, chat: Sequence[ChatTurn] | None,
                   ids: Sequence[int] | None) -> list[int]:
        """Token ids of a prompt given as text, chat turns or ids; checked against the limits.

        Text is measured before it is tokenized: more UTF-8 bytes than PROMPT_BYTES_PER_TOKEN
        per allowed prompt token is over the limit whatever it would tokenize to.
        """
        if text is not None:
            tokenizer = self.need_tokenizer("a text prompt")
            self._check_text_size(len(text.encode()), "prompt.text")
            tokens = [int(t) for t in tokenizer.encode(text)]
        elif chat is not None:
            tokenizer = self.need_tokenizer("a chat prompt")
            if not chat:
                raise InvalidRequest("a chat prompt needs at least one message", reason="EMPTY_PROMPT",
                                     field="prompt.chat.messages")
            self._check_text_size(sum(len(m.role.encode()) + len(m.content.encode()) + CHAT_TURN_BYTES
                                      for m in chat), "prompt.chat.messages")
            from engine.chat_template import ChatMessage

            tokens = [int(t) for t in tokenizer.encode_chat([ChatMessage(m.role, m.content) for m in chat])]
        else:
            tokens = [int(t) for t in ids or ()]
        return self.check_ids(tokens)

    def _check_text_size(self, size: int, field: str) -> None:
        limit = self.max_prompt_tokens * PROMPT_BYTES_PER_TOKEN
        if size > limit:
            raise LimitExceeded(f"the prompt text is {size} bytes; the limit is {limit} "
                                f"({PROMPT_BYTES_PER_TOKEN} for each of {self.max_prompt_tokens} tokens)",
                                reason="PROMPT_TOO_LONG", field=field)

    def check_ids(self, tokens: list[int], field: str = "prompt.tokens.ids") -> list[int]:
        if not tokens:
            raise InvalidRequest("the prompt is empty", reason="EMPTY_PROMPT", field="prompt")
        bad = next((t for t in tokens if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidRequest(f"token id {bad} is outside the vocabulary of {self.vocab_size}",
                                 reason="TOKEN_OUT_OF_VOCABULARY", field=field)
        if len(tokens) > self.max_prompt_tokens:
            raise LimitExceeded(f"the prompt has {len(tokens)} tokens; the limit is {self.max_prompt_tokens}",
                                reason="PROMPT_TOO_LONG", field="prompt")
        return tokens

    def budget(self, stopping: Stopping, past: int, held: str = "the prompt's") -> Stopping:
        """Resolve max_new_tokens against the limit and the room left after `past` tokens.

        The last new token is chosen from the logits of the one before it and needs no KV
        slot: a prompt of exactly the capacity still gets one token (finish reason CAPACITY).
        """
        room = self.capacity - past + 1
        if room < 1:
            raise OutOfRange(f"{held} {past} tokens exceed the KV capacity of {self.capacity}")
        wanted = stopping.max_new_tokens
        if wanted > self.max_new_tokens:
            raise LimitExceeded(f"max_new_tokens {wanted} is over the limit of {self.max_new_tokens}",
                                reason="MAX_NEW_TOKENS_OVER_LIMIT", field="stopping.max_new_tokens")
        if wanted == 0:
            wanted = min(self.default_new_tokens, room)
        if wanted > room:
            raise OutOfRange(f"{held} {past} tokens + {wanted} new tokens do not fit in the KV capacity "
                             f"of {self.capacity}: at most {room} new tokens do")
        if stopping.stop:
            self.need_tokenizer("stop sequences")
        return Stopping(wanted, stopping.stop, stopping.ignore_eos, stopping.stop_token_ids)


@dataclass(frozen=True)
class LogprobRequest:
    """What a request asks for besides tokens: `top` alternatives per token, prompt tokens' too."""

    top: int = 0
    prompt: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.top <= MAX_TOP_LOGPROBS:
            raise InvalidRequest(f"logprobs.top is {self.top}; at most {MAX_TOP_LOGPROBS} alternatives are "
                                 "returned", reason="INVALID_LOGPROBS", field="logprobs.top")


def make_sampler(params: SamplingParams, logprobs: LogprobRequest | None) -> Sampler:
    """A checked sampler that also reports the log-probabilities of its choices when asked."""
    return Sampler(check_sampling(params), None if logprobs is None else logprobs.top)


def check_sampling(params: SamplingParams) -> SamplingParams:
    try:
        params.validate()
    except ValueError as exc:
        name = str(exc).split(" ", 1)[0]  # SamplingParams.validate names the value first
        raise InvalidRequest(str(exc), reason="INVALID_SAMPLING", field=f"sampling.{name}") from exc
    return params


class StopText:
    """Streams text while holding back any tail that could still begin a stop sequence.

    Linear in the stop strings: per stop, a KMP matcher carries the longest tail of
    the text so far that is a proper prefix of it, advanced by each new piece only.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self._failure = [_failure(s) for s in self.stops]
        self._matched = [0] * len(self.stops)
        self.held = ""
        self.stopped = False

    def push(self, piece: str) -> str:
        text = self.held + piece
        for stop in self.stops:
            if (cut := text.find(stop)) >= 0:
                self.held, self.stopped = "", True
                self._matched = [0] * len(self.stops)
                return text[:cut]
        matchers = zip(self.stops, self._failure, self._matched, strict=True)
        self._matched = [_advance(stop, failure, matched, piece) for stop, failure, matched in matchers]
        keep = max(self._matched, default=0)  # never more than `text` holds: see _advance
        self.held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]


def _failure(stop: str) -> list[int]:
    """KMP: for each prefix of `stop`, the length of its longest proper border."""
    failure = [0] * len(stop)
    k = 0
    for i in range(1, len(stop)):
        while k and stop[i] != stop[k]:
            k = failure[k - 1]
        if stop[i] == stop[k]:
            k += 1
        failure[i] = k
    return failure


def _advance(stop: str, failure: list[int], matched: int, piece: str) -> int:
    """The longest proper prefix of `stop` the text ends with, after `piece` is appended.

    It grows by at most len(piece), so it always lies within the held tail plus the piece.
    """
    for char in piece:
        while matched and stop[matched] != char:
            matched = failure[matched - 1]
        if stop[matched] == char:
            matched += 1
        if matched == len(stop):  # a whole match: StopText.push finds it first; stay proper
            matched = failure[matched - 1]
    return matched


# -- worker-side bodies: they ask the scheduler for engine work and never call the engine themselves --

def prefill_steps(engine: Any, session: Any, tokens: list[int], tally: PrefillTally,
                  share: bool = True, logprob_top: int | None = None) -> Generator[Any, Any, None]:
    """Append the prompt, one forward per round; the session's next-token logits follow it. An empty
    session first takes the longest prefix of the prompt held for its caller (`share`). With
    `logprob_top`, the prompt's log-probabilities follow the last forward (PromptLogprobs): the
    caller then shares nothing, as a shared prefix has no logits rows to score."""
    if share:
        shared = yield Call(lambda: engine.share_prefix(session, tokens))
        tally.shared_rows += shared
        tokens = tokens[shared:]
    task = yield Call(lambda: engine.start_prefill(session, tokens, logprob_top=logprob_top))
    while not task.done:
        report = yield Chunk(task)
        forward = report.forward
        tally.forwards += 1
        tally.real_rows += forward.rows
        tally.padded_rows += report.width - forward.rows
        tally.widths.append(report.width)
        yield ForwardDone(forward.rows, report.width, forward.past, report.length)
    if logprob_top is not None:
        yield PromptLogprobs(tuple(task.logprobs))


def decode_steps(model: Model, session: Any, sampler: Sampler, stopping: Stopping,
                 feed_last: bool, sample: int = 0) -> Generator[Any, Any, None]:
    """Choose, emit and feed tokens from the session's next-token logits.

    The first token is chosen from the logits the session holds, every later one
    by the round's decode forward, all by the engine. With `feed_last` the session
    keeps every emitted token (so the next Decode continues after it); a session
    left mid-way holds the tokens fed so far and their logits, so it stays usable.
    """
    engine = model.engine
    stream = model.tokenizer.stream(skip_special=True) if model.tokenizer is not None else None
    stop_text = StopText(stopping.stop)
    reason = Finish.LENGTH
    token = yield Call(lambda: engine.choose(session, sampler))
    for index in range(stopping.max_new_tokens):
        piece = stop_text.push(stream.push(token)) if stream is not None else ""
        yield TokenOut(token, piece, index, time.perf_counter(), sampler.last, sample)
        stopped = _stop_reason(model, stopping, token, stop_text)
        if stopped is not None or session.length + 1 > model.capacity:
            reason = stopped or Finish.CAPACITY
            break
        if index + 1 < stopping.max_new_tokens:
            token = yield Token(DecodeRow(session, token, sampler))
    tail = "" if stop_text.stopped or stream is None else stop_text.push(stream.flush()) + stop_text.held
    if feed_last and session.length + 1 <= model.capacity:
        yield Token(DecodeRow(session, token))  # fed, not chosen from: the next Decode chooses
    yield Finished(reason, tail, session.length, sample)


def _stop_reason(model: Model, stopping: Stopping, token: int, stop_text: StopText) -> Finish | None:
    if token in model.eos_ids and not stopping.ignore_eos:
        return Finish.EOS
    if token in stopping.stop_token_ids or stop_text.stopped:
        return Finish.STOP
    return None


def generate_body(model: Model, tokens: list[int], samplers: Sequence[Sampler], stopping: Stopping,
                  tally: PrefillTally, scope: str = "",
                  prompt_logprobs: int | None = None) -> Generator[Any, Any, None]:
    """Generate len(samplers) samples on sessions of their own (waiting for as many free slots), returned
    to the pool however it ends. The first session starts from the longest prefix of the prompt held
    for `scope` (none when the prompt's log-probabilities are asked for) and prefills the rest; the
    other samples start from a copy of its KV rows and logits, and every sample decodes in the same
    forwards."""
    shared = () if prompt_logprobs is not None else tuple(tokens)
    granted = yield OpenSlot(shared, scope, len(samplers))
    sessions: list[Any] = granted if isinstance(granted, list) else [granted]
    try:
        yield Started(time.perf_counter())
        first = sessions[0]
        tally.shared_rows += first.length
        yield from prefill_steps(model.engine, first, tokens[first.length:], tally, share=False,
                                 logprob_top=prompt_logprobs)
        for other in sessions[1:]:
            yield Call(functools.partial(model.engine.copy_session, first, other))
        bodies = [decode_steps(model, session, sampler, stopping, feed_last=False, sample=i)
                  for i, (session, sampler) in enumerate(zip(sessions, samplers, strict=True))]
        yield from bodies[0] if len(bodies) == 1 else side_by_side(bodies)
    finally:
        for session in sessions:
            model.engine.close_session(session)


def side_by_side(bodies: list[Generator[Any, Any, None]]) -> Generator[Any, Any, None]:
    """Run several job bodies as one: each round, every body that wants a decode row gets it in one
    Tokens request (so all of them ride one forward); calls and events pass through as they come."""
    replies: dict[int, Any] = dict.fromkeys(range(len(bodies)))
    live = dict(enumerate(bodies))
    try:
        while live:
            wants: dict[int, DecodeRow] = {}
            for i in list(live):
                row = yield from _until_token(live[i], replies.pop(i, None))
                if row is None:
                    del live[i]
                else:
                    wants[i] = row
            if wants:
                tokens = yield Tokens(tuple(wants.values()))
                replies.update(zip(wants, tokens, strict=True))
    finally:
        for body in live.values():
            body.close()


def _until_token(body: Generator[Any, Any, None], reply: Any) -> Generator[Any, Any, DecodeRow | None]:
    """Advance `body` up to its next decode row (None once it has ended), passing the rest through."""
    while True:
        try:
            item = body.send(reply)
        except StopIteration:
            return None
        if isinstance(item, Token):
            return item.row
        reply = yield item


def prefill_body(model: Model, state: SessionState, tokens: list[int],
                 tally: PrefillTally) -> Generator[Any, Any, None]:
    """Extend a session by one prompt part."""
    yield from prefill_steps(model.engine, state.session, tokens, tally)


def decode_body(model: Model, state: SessionState, sampler: Sampler,
                stopping: Stopping) -> Generator[Any, Any, None]:
    """Continue a session; checked on the worker, after any earlier job on it has ended."""
    yield Started(time.perf_counter())
    session = state.session
    if not session.has_logits:
        raise OutOfRange(f"session {state.id} has nothing to continue from (it is empty)")
    if session.length >= model.capacity:  # its last token may not be in it: nothing can follow
        raise OutOfRange(f"session {state.id} holds {session.length} tokens, its full KV capacity: "
                         "rewind it to continue")
    budget = model.budget(stopping, session.length, f"session {state.id}'s")
    yield from decode_steps(model, session, sampler, budget, feed_last=True)


def close(model: Model, state: SessionState) -> int:
    """Return the session's KV slot; the tokens it held."""
    length: int = state.session.length
    model.engine.close_session(state.session)
    return length


def next_token(model: Model, state: SessionState, sampler: Sampler) -> PrefillFinished:
    """The token the sampler picks from the session's logits (not fed)."""
    session = state.session
    if not session.has_logits:
        raise OutOfRange("the session has no next-token logits (it is empty)")
    token = model.engine.choose(session, sampler)
    text = model.tokenizer.decode([token]) if model.tokenizer is not None else ""
    return PrefillFinished(session.length, token, text)


@dataclass(frozen=True)
class Forked:
    session: Any  # engine.executor.Session
    ms: float  # time the worker spent


def fork(model: Model, state: SessionState, length: int | None) -> Forked:
    """A new engine session holding a copy of the session's first `length` tokens (None: all)."""
    started = time.perf_counter()
    session = model.engine.fork(state.session, length)
    return Forked(session, (time.perf_counter() - started) * 1e3)


def rewind(model: Model, state: SessionState, length: int) -> int:
    """Keep the first `length` tokens; the engine restores the logits of the tokens kept."""
    session = state.session
    if not 0 <= length <= session.length:
        raise InvalidRequest(f"cannot rewind to {length}: the session holds {session.length}",
                             reason="REWIND_PAST_END", field="length")
    model.engine.rewind(session, length)
    return int(session.length)
