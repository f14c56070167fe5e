"""What a call asks for: typed values built from protobuf at the door (service/grpc/wire.py), checked once.

A value here refuses, as it is built, whatever no model could serve: too many
or too long stop strings, a sampling value out of range, more log-probability
alternatives than are returned, prompt log-probabilities on Decode. What
depends on the model (token ids in its vocabulary, the server's limits, the
room left in the KV capacity, a tokenizer) is checked by service.served_model.ServedModel
when it resolves the prompt and the budget. Nothing here knows protobuf.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.chat_messages import ChatMessage, FunctionTool
from engine.errors import InvalidInput
from engine.sampling import MAX_TOP_LOGPROBS, Sampler, SamplingParams
from service.errors import TooLarge

MAX_PLAIN_ID = 128  # a request id, a fork_id, a pod's random session id
ID_CHARACTERS = re.compile(r"[A-Za-z0-9._-]+")  # what ids are made of (session ids too)


def plain_id(text: str) -> bool:
    """Whether `text` may name a request or a fork: 1 to 128 characters of A-Z a-z 0-9 . _ -."""
    return len(text) <= MAX_PLAIN_ID and ID_CHARACTERS.fullmatch(text) is not None


MAX_STOPS = 16  # stop strings per request
MAX_STOP_CHARS = 512  # characters per stop string


@dataclass(frozen=True)
class Prompt:
    """A prompt as the client sent it: text, chat messages or token ids (exactly one is set); a chat
    may come with the tools its template is given."""

    text: str | None = None
    chat: tuple[ChatMessage, ...] | None = None
    ids: tuple[int, ...] | None = None
    tools: tuple[FunctionTool, ...] = ()


@dataclass(frozen=True)
class Stopping:
    max_new_tokens: int = 0  # 0 = the server's default (ServedModel.default_new_tokens), as many as fit
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    stop_token_ids: frozenset[int] = frozenset()
    include_stop: bool = False  # a stop string that ends the text is part of it (HTTP: vLLM's extra)
    min_new_tokens: int = 0  # no end-of-sequence, stop token or stop string before (HTTP: min_tokens)

    def __post_init__(self) -> None:
        """Bounded work per token: a few stop strings of bounded length; min_new_tokens within max."""
        if not 0 <= self.min_new_tokens <= (self.max_new_tokens or self.min_new_tokens):
            raise InvalidInput(
                f"min_new_tokens is {self.min_new_tokens}; it takes 0 to max_new_tokens "
                f"({self.max_new_tokens})",
                reason="INVALID_MIN_TOKENS",
                field="stopping.min_new_tokens",
            )
        if len(self.stop) > MAX_STOPS:
            raise InvalidInput(
                f"{len(self.stop)} stop strings; at most {MAX_STOPS} are allowed",
                reason="TOO_MANY_STOPS",
                field="stopping.stop",
            )
        longest = max((len(s) for s in self.stop), default=0)
        if longest > MAX_STOP_CHARS:
            raise InvalidInput(
                f"a stop string of {longest} characters; the most is {MAX_STOP_CHARS}",
                reason="STOP_TOO_LONG",
                field="stopping.stop",
            )


@dataclass(frozen=True)
class LogprobRequest:
    """What a request asks for besides tokens: `top` alternatives per token, prompt tokens' too."""

    top: int = 0
    prompt: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.top <= MAX_TOP_LOGPROBS:
            raise InvalidInput(
                f"logprobs.top is {self.top}; at most {MAX_TOP_LOGPROBS} alternatives are returned",
                reason="INVALID_LOGPROBS",
                field="logprobs.top",
            )


def checked_sampling(params: SamplingParams) -> SamplingParams:
    """`params`, or InvalidInput naming the first bad value as the request's field."""
    try:
        params.validate()
    except ValueError as exc:
        name = str(exc).split(" ", 1)[0]  # SamplingParams.validate names the value first
        raise InvalidInput(str(exc), reason="INVALID_SAMPLING", field=f"sampling.{name}") from exc
    return params


def sampler_of(params: SamplingParams, logprobs: LogprobRequest | None) -> Sampler:
    """A sampler that also reports the log-probabilities of its choices when asked."""
    return Sampler(params, None if logprobs is None else logprobs.top)


CONSTRAINT_KINDS = ("json_schema", "regex", "choice", "grammar")
MAX_CONSTRAINT_BYTES = 64 << 10  # the text of a schema, regex or grammar, or all choices together


@dataclass(frozen=True)
class ConstraintSpec:
    """What generated text must match (structured output): a JSON Schema, a regex or a grammar as text,
    or the choices. Compiled (and cached) by service/core/constraints.py; checked here only for size."""

    kind: str
    text: str = ""
    options: tuple[str, ...] = ()
    strict: bool | None = None  # json_schema read as OpenAI's strict mode does (None: --json-schema-strict)

    def __post_init__(self) -> None:
        field = f"constraint.{self.kind}" + (".options" if self.kind == "choice" else "")
        if self.kind not in CONSTRAINT_KINDS:
            raise InvalidInput(
                "a constraint names one of json_schema, regex, choice or grammar",
                reason="CONSTRAINT_REQUIRED",
                field="constraint",
            )
        texts = self.options if self.kind == "choice" else (self.text,)
        size = sum(len(t.encode()) for t in texts)
        if size > MAX_CONSTRAINT_BYTES:
            raise InvalidInput(
                f"the constraint is {size} bytes; the limit is {MAX_CONSTRAINT_BYTES}",
                reason="CONSTRAINT_TOO_LARGE",
                field=field,
            )
        if self.kind == "choice" and not self.options:
            raise InvalidInput(
                "a choice constraint needs at least one option", reason="CONSTRAINT_EMPTY", field=field
            )
        if self.kind != "choice" and not self.text.strip():
            raise InvalidInput(f"the {self.kind} constraint is empty", reason="CONSTRAINT_EMPTY", field=field)

    @property
    def spec(self) -> str | tuple[str, ...]:
        return self.options if self.kind == "choice" else self.text


@dataclass(frozen=True)
class GenerateCall:
    """Generate and GenerateStream: a prompt, n samples of it, how to choose and when to stop."""

    prompt: Prompt
    stopping: Stopping
    sampling: SamplingParams
    n: int = 1
    logprobs: LogprobRequest | None = None
    constraint: ConstraintSpec | None = None
    speculate: bool = True  # False: no drafts for this call (the server's --speculate otherwise)

    def __post_init__(self) -> None:
        checked_sampling(self.sampling)

    @property
    def prompt_top(self) -> int | None:
        """Alternatives per prompt token when the prompt's log-probabilities are asked for, else None."""
        return self.logprobs.top if self.logprobs is not None and self.logprobs.prompt else None

    def samplers(self) -> list[Sampler]:
        """One sampler per sample, seeded seed, seed + 1, ... (SamplingParams.for_sample)."""
        return [sampler_of(self.sampling.for_sample(i), self.logprobs) for i in range(self.n)]


# The fewest bytes each part of a Completion can take (protobuf's encoding: a field's tag and
# length prefix, a varint of at least one byte, a float of four): a response that needs more than
# the message limit even at these sizes cannot be sent, whatever its tokens turn out to be.
MIN_TOKEN_ID_BYTES = 1  # a packed varint
TIMING_BYTES_PER_TOKEN = 8  # Timing.inter_token_ms: a packed double per gap
MIN_LOGPROB_BYTES = 9  # TokenLogprobs / Alternative: tag + length, id (tag + varint), logprob (tag + float)


def least_response_bytes(tokens: int, samples: int, logprobs: LogprobRequest | None, prompt: int = 0) -> int:
    """A lower bound on the size of the Completion of `samples` samples of `tokens` tokens each
    (every token generated), with the log-probabilities asked for (`prompt` prompt tokens)."""
    per_token = MIN_TOKEN_ID_BYTES
    scored = 0
    if logprobs is not None:
        per_token += MIN_LOGPROB_BYTES * (1 + logprobs.top)
        if logprobs.prompt:
            scored = max(prompt - 1, 0) * MIN_LOGPROB_BYTES * (1 + logprobs.top)
    return samples * tokens * per_token + max(tokens - 1, 0) * TIMING_BYTES_PER_TOKEN + scored


def check_response_fits(
    tokens: int, samples: int, logprobs: LogprobRequest | None, prompt: int, limit: int
) -> None:
    """Refuse, before any work, a request whose answer at full length cannot fit in one message."""
    least = least_response_bytes(tokens, samples, logprobs, prompt)
    if least > limit:
        asked = [f"n = {samples}", f"max_new_tokens = {tokens}"]
        if logprobs is not None:
            prompt_too = " with logprobs.prompt" if logprobs.prompt else ""
            asked.append(f"logprobs.top = {logprobs.top}{prompt_too}")
        raise TooLarge(
            f"the answer to {', '.join(asked)} takes at least {least} bytes at full length, "
            f"over the message limit of {limit} bytes (--max-message-bytes): ask for fewer "
            "tokens, samples or alternatives",
            reason="RESPONSE_TOO_LARGE",
            field="stopping.max_new_tokens",
            metadata={"limit_bytes": str(limit), "least_bytes": str(least)},
        )


@dataclass(frozen=True)
class DecodeCall:
    """Decode: continue a session's tokens."""

    session_id: str
    stopping: Stopping
    sampling: SamplingParams
    logprobs: LogprobRequest | None = None
    constraint: ConstraintSpec | None = None
    speculate: bool = True  # False: no drafts for this call (the server's --speculate otherwise)

    def __post_init__(self) -> None:
        if self.logprobs is not None and self.logprobs.prompt:
            raise InvalidInput(
                "Decode has no prompt: logprobs.prompt is for Generate and GenerateStream",
                reason="INVALID_LOGPROBS",
                field="logprobs.prompt",
            )
        checked_sampling(self.sampling)

    def sampler(self) -> Sampler:
        return sampler_of(self.sampling, self.logprobs)


@dataclass(frozen=True)
class PrefillCall:
    """A Prefill's first message: the session it extends ("" opens one), its first prompt part, and the
    sampling of the next token PrefillDone previews."""

    session_id: str
    prompt: Prompt
    sampling: SamplingParams
    last: bool = False  # this message ends the prompt (PrefillRequest.last)

    def __post_init__(self) -> None:
        checked_sampling(self.sampling)

    def sampler(self) -> Sampler:
        return Sampler(self.sampling)


@dataclass(frozen=True)
class ForkCall:
    """ForkSession: copy the caller's session `session_id` up to `length` tokens (None: all), as the
    fork the client names `fork_id` ("": a fork with a random id)."""

    session_id: str
    length: int | None = None
    fork_id: str = ""

    def __post_init__(self) -> None:
        if self.fork_id and not plain_id(self.fork_id):
            # Not repeated back: the client's bytes stay out of the status, as a malformed session id does.
            raise InvalidInput(
                f"fork_id must be 1 to {MAX_PLAIN_ID} characters of A-Z a-z 0-9 . _ - "
                f"(it has {len(self.fork_id)})",
                reason="INVALID_FORK_ID",
                field="fork_id",
            )
