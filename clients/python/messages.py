"""Typed options and prompt inputs, and the protobuf requests built from them.

Owns the one translation from Python values to `ladder.v1` request messages, shared
by the sync and async clients so both send exactly the same requests.
A prompt is text (`str`), token ids (`list[int]`) or a conversation (`list[Turn]`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from proto.ladder.v1 import ladder_pb2 as pb


@dataclass(frozen=True)
class Turn:
    """One chat message: role is "system", "user" or "assistant"."""

    role: str
    content: str


PromptInput = str | Sequence[int] | Sequence[Turn]


@dataclass(frozen=True)
class Sampling:
    """Greedy by default; the server validates the values (INVALID_ARGUMENT when out of range)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def to_proto(self) -> pb.SamplingOptions:
        msg = pb.SamplingOptions(
            temperature=self.temperature,
            top_k=self.top_k,
            min_p=self.min_p,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
        )
        if self.top_p is not None:
            msg.top_p = self.top_p
        if self.repetition_penalty is not None:
            msg.repetition_penalty = self.repetition_penalty
        if self.seed is not None:
            msg.seed = self.seed
        return msg


@dataclass(frozen=True)
class Stopping:
    """max_new_tokens 0 lets the server fill the KV capacity up to its own limit."""

    max_new_tokens: int = 0
    stop: Sequence[str] = field(default_factory=tuple)
    ignore_eos: bool = False
    stop_token_ids: Sequence[int] = field(default_factory=tuple)
    min_new_tokens: int = 0  # no end-of-sequence, stop token or stop string before this many tokens

    def to_proto(self) -> pb.StoppingOptions:
        return pb.StoppingOptions(
            max_new_tokens=self.max_new_tokens,
            stop=list(self.stop),
            ignore_eos=self.ignore_eos,
            stop_token_ids=list(self.stop_token_ids),
            min_new_tokens=self.min_new_tokens,
        )


@dataclass(frozen=True)
class Logprobs:
    """Ask for log-probabilities: each token's, `top` alternatives (at most 20), the prompt's too."""

    top: int = 0
    prompt: bool = False

    def to_proto(self) -> pb.LogprobOptions:
        return pb.LogprobOptions(top=self.top, prompt=self.prompt)


CONSTRAINT_KINDS = ("json_schema", "regex", "choice", "grammar")


@dataclass(frozen=True)
class Constraint:
    """Structured output: the text must match exactly one of a JSON Schema (JSON text, or a value
    such as a dict that json.dumps writes), a regex, one of the choices, or a GBNF grammar."""

    json_schema: Any = None
    regex: str | None = None
    choice: Sequence[str] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        given = [kind for kind in CONSTRAINT_KINDS if getattr(self, kind) is not None]
        if len(given) != 1:
            raise ValueError(f"a Constraint is one of {', '.join(CONSTRAINT_KINDS)}; got {given or 'none'}")

    def to_proto(self) -> pb.Constraint:
        if self.regex is not None:
            return pb.Constraint(regex=self.regex)
        if self.choice is not None:
            return pb.Constraint(choice=pb.Choices(options=list(self.choice)))
        if self.grammar is not None:
            return pb.Constraint(grammar=self.grammar)
        schema = self.json_schema
        return pb.Constraint(json_schema=schema if isinstance(schema, str) else json.dumps(schema))


def chat_proto(turns: Iterable[Turn]) -> pb.Chat:
    return pb.Chat(messages=[pb.ChatMessage(role=t.role, content=t.content) for t in turns])


def prompt_proto(prompt: PromptInput) -> pb.Prompt:
    """Text, token ids or a conversation as a `Prompt`; an empty list is an empty token prompt."""
    if isinstance(prompt, str):
        return pb.Prompt(text=prompt)
    items = list(prompt)
    if items and all(isinstance(item, Turn) for item in items):
        return pb.Prompt(chat=chat_proto(items))  # type: ignore[arg-type]
    if all(isinstance(item, int) and not isinstance(item, bool) for item in items):
        return pb.Prompt(tokens=pb.TokenIds(ids=items))  # type: ignore[arg-type]
    raise TypeError("a prompt is a str, a list of token ids or a list of Turn")


def generate_request(
    prompt: PromptInput,
    sampling: Sampling | None,
    stopping: Stopping | None,
    n: int = 1,
    logprobs: Logprobs | None = None,
    constraint: Constraint | None = None,
    coalesce: bool = False,
) -> pb.GenerateRequest:
    request = pb.GenerateRequest(
        prompt=prompt_proto(prompt),
        sampling=(sampling or Sampling()).to_proto(),
        stopping=(stopping or Stopping()).to_proto(),
        n=n,
        coalesce_tokens=coalesce,
    )
    if logprobs is not None:
        request.logprobs.CopyFrom(logprobs.to_proto())
    if constraint is not None:
        request.constraint.CopyFrom(constraint.to_proto())
    return request


def prefill_request(
    part: PromptInput, *, first: bool, session_id: str, sampling: Sampling | None
) -> pb.PrefillRequest:
    """One message of a Prefill stream: only the first names the session and the sampling."""
    if not first:
        return pb.PrefillRequest(prompt=prompt_proto(part))
    return pb.PrefillRequest(
        session_id=session_id, prompt=prompt_proto(part), sampling=(sampling or Sampling()).to_proto()
    )


def prefill_requests(
    parts: Iterable[PromptInput], session_id: str, sampling: Sampling | None
) -> Iterator[pb.PrefillRequest]:
    """The parts as they come, then a bare `last`: the server keeps the extension once it sends
    PrefillDone, whether or not this side reads the call's status."""
    index = -1
    for index, part in enumerate(parts):
        yield prefill_request(part, first=index == 0, session_id=session_id, sampling=sampling)
    if index >= 0:
        yield pb.PrefillRequest(last=True)


def decode_request(
    session_id: str,
    max_new_tokens: int,
    sampling: Sampling | None,
    stopping: Stopping | None,
    logprobs: Logprobs | None = None,
    constraint: Constraint | None = None,
    coalesce: bool = False,
) -> pb.DecodeRequest:
    stop = stopping or Stopping()
    options = stop.to_proto()
    options.max_new_tokens = max_new_tokens
    request = pb.DecodeRequest(
        session_id=session_id,
        sampling=(sampling or Sampling()).to_proto(),
        stopping=options,
        coalesce_tokens=coalesce,
    )
    if logprobs is not None:
        request.logprobs.CopyFrom(logprobs.to_proto())
    if constraint is not None:
        request.constraint.CopyFrom(constraint.to_proto())
    return request


def tokenize_request(source: str | Sequence[Turn]) -> pb.TokenizeRequest:
    if isinstance(source, str):
        return pb.TokenizeRequest(text=source)
    return pb.TokenizeRequest(chat=chat_proto(source))


def fork_session_id(source_session_id: str, fork_id: str) -> str:
    """The session id ForkSession gives the fork of `source_session_id` named `fork_id`: known before
    the call, so a client that never hears the answer can still close the fork."""
    return f"{source_session_id.partition('.')[0]}.f.{fork_id}"


def tokens_of(event: pb.TokenEvent) -> Sequence[pb.Token]:
    """The tokens one event carries, whichever way the stream sends them: one (`token`), several
    (`tokens`, when the call asked to coalesce them), none (`done`)."""
    kind = event.WhichOneof("event")
    if kind == "token":
        return (event.token,)
    return event.tokens.tokens if kind == "tokens" else ()


def completion_of(events: Iterable[pb.TokenEvent]) -> pb.Completion:
    """The final Completion of a token stream (RuntimeError if the stream ended without one)."""
    for event in events:
        if event.WhichOneof("event") == "done":
            return event.done
    raise RuntimeError("the token stream ended without a Completion")
