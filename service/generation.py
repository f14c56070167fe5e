"""The model a server serves, and the job bodies the worker runs for its calls.

A call arrives as a typed value (service/calls.py), converted and checked at the
door. Model resolves its prompt to token ids and its budget against the
server's limits and the KV capacity; the worker-side generators here yield
events for the caller (service/events.py) and requests for the scheduler (a
slot, a prefill chunk, a decode row). It never sees protobuf and never touches
tensors.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

from engine.errors import InvalidInput, OverCapacity
from engine.executor import DecodeRow
from engine.executor.sampling import Sampler
from service.calls import Prompt, Stopping
from service.errors import NoTokenizer, OverLimit
from service.events import (
    Finish,
    Finished,
    ForwardDone,
    PrefillFinished,
    PrefillTally,
    PromptLogprobs,
    Started,
    TokenOut,
)
from service.requests import Call, Chunk, OpenSlot, Token, Tokens
from service.sessions import SessionState
from service.stop_text import StopText

PROMPT_BYTES_PER_TOKEN = 32  # text and chat prompts: UTF-8 bytes allowed per allowed prompt token
CHAT_MESSAGE_BYTES = 32  # what each chat message counts beyond its role and content (the template's markup)


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

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt given as text, chat messages or ids; checked against the limits.

        Text is measured before it is tokenized: more UTF-8 bytes than PROMPT_BYTES_PER_TOKEN
        per allowed prompt token is over the limit whatever it would tokenize to.
        """
        if prompt.text is not None:
            tokenizer = self.need_tokenizer("a text prompt")
            self._check_text_size(len(prompt.text.encode()), "prompt.text")
            tokens = [int(t) for t in tokenizer.encode(prompt.text)]
        elif prompt.chat is not None:
            tokenizer = self.need_tokenizer("a chat prompt")
            if not prompt.chat:
                raise InvalidInput("a chat prompt needs at least one message", reason="EMPTY_PROMPT",
                                   field="prompt.chat.messages")
            self._check_text_size(sum(len(m.role.encode()) + len(m.content.encode()) + CHAT_MESSAGE_BYTES
                                      for m in prompt.chat), "prompt.chat.messages")
            tokens = [int(t) for t in tokenizer.encode_chat(prompt.chat)]
        else:
            tokens = list(prompt.ids or ())  # Python ints already (the wire's repeated int32)
        return self.check_ids(tokens)

    def _check_text_size(self, size: int, field: str) -> None:
        limit = self.max_prompt_tokens * PROMPT_BYTES_PER_TOKEN
        if size > limit:
            raise OverLimit(f"the prompt text is {size} bytes; the limit is {limit} "
                            f"({PROMPT_BYTES_PER_TOKEN} for each of {self.max_prompt_tokens} tokens)",
                            reason="PROMPT_TOO_LONG", field=field)

    def check_ids(self, tokens: list[int], field: str = "prompt.tokens.ids") -> list[int]:
        if not tokens:
            raise InvalidInput("the prompt is empty", reason="EMPTY_PROMPT", field="prompt")
        bad = next((t for t in tokens if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidInput(f"token id {bad} is outside the vocabulary of {self.vocab_size}",
                               reason="TOKEN_OUT_OF_VOCABULARY", field=field)
        if len(tokens) > self.max_prompt_tokens:
            raise OverLimit(f"the prompt has {len(tokens)} tokens; the limit is {self.max_prompt_tokens}",
                            reason="PROMPT_TOO_LONG", field="prompt")
        return tokens

    def budget(self, stopping: Stopping, past: int, held: str = "the prompt's") -> Stopping:
        """Resolve max_new_tokens against the limit and the room left after `past` tokens.

        The last new token is chosen from the logits of the one before it and needs no KV
        slot: a prompt of exactly the capacity still gets one token (finish reason CAPACITY).
        """
        room = self.capacity - past + 1
        if room < 1:
            raise OverCapacity(f"{held} {past} tokens exceed the KV capacity of {self.capacity}")
        wanted = stopping.max_new_tokens
        if wanted > self.max_new_tokens:
            raise OverLimit(f"max_new_tokens {wanted} is over the limit of {self.max_new_tokens}",
                            reason="MAX_NEW_TOKENS_OVER_LIMIT", field="stopping.max_new_tokens")
        if wanted == 0:
            wanted = min(self.default_new_tokens, room)
        if wanted > room:
            raise OverCapacity(f"{held} {past} tokens + {wanted} new tokens do not fit in the KV "
                               f"capacity of {self.capacity}: at most {room} new tokens do")
        if stopping.stop:
            self.need_tokenizer("stop sequences")
        return Stopping(wanted, stopping.stop, stopping.ignore_eos, stopping.stop_token_ids)


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
            # The token chosen here is fed next only if another follows it or the session keeps it.
            more = (index + 2 < stopping.max_new_tokens or feed_last) and session.length + 2 <= model.capacity
            token = yield Token(DecodeRow(session, token, sampler, more))
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
        raise OverCapacity(f"session {state.id} has nothing to continue from (it is empty)")
    if session.length >= model.capacity:  # its last token may not be in it: nothing can follow
        raise OverCapacity(f"session {state.id} holds {session.length} tokens, its full KV capacity: "
                           "rewind it to continue")
    budget = model.budget(stopping, session.length, f"session {state.id}'s")
    sampler.counts.update(state.generated_tokens())  # penalties go on from the earlier Decodes
    start = session.length
    try:
        yield from decode_steps(model, session, sampler, budget, feed_last=True)
    finally:
        state.generated.extend(range(start, session.length))


def close(model: Model, state: SessionState) -> int:
    """Return the session's KV slot; the tokens it held."""
    length: int = state.session.length
    model.engine.close_session(state.session)
    return length


def peek_token(model: Model, state: SessionState, sampler: Sampler) -> PrefillFinished:
    """The token the sampler picks from the session's logits, not fed: the session is left as it is
    (PrefillDone's preview of the next token)."""
    session = state.session
    if not session.has_logits:
        raise OverCapacity("the session has no next-token logits (it is empty)")
    token = model.engine.choose(session, sampler)
    text = model.tokenizer.decode([token]) if model.tokenizer is not None else ""
    return PrefillFinished(session.length, token, text)


@dataclass(frozen=True)
class Forked:
    session: Any  # engine.executor.Session
    ms: float  # time the worker spent


def check_length(session: Any, length: int) -> None:
    """A length Rewind or ForkSession keeps must be one the session holds."""
    if not 0 <= length <= session.length:
        raise InvalidInput(f"cannot keep {length} tokens: the session holds {session.length}",
                           reason="LENGTH_PAST_END", field="length")


def fork(model: Model, state: SessionState, length: int | None) -> Forked:
    """A new engine session holding a copy of the session's first `length` tokens (None: all)."""
    if length is not None:
        check_length(state.session, length)
    started = time.perf_counter()
    session = model.engine.fork(state.session, length)
    return Forked(session, (time.perf_counter() - started) * 1e3)


def rewind(model: Model, state: SessionState, length: int) -> int:
    """Keep the first `length` tokens; the engine restores the logits of the tokens kept."""
    session = state.session
    check_length(session, length)
    model.engine.rewind(session, length)
    return int(session.length)
