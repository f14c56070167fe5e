"""The model a server serves: what every call sees of it (ModelView: the engine's facts, its
tokenizer and the server's limits; a frontend process builds one from a ModelSpec) and the loaded
engine behind it (ServedModel). A call's prompt becomes token ids here (bounded in bytes first,
checked against the vocabulary and the prompt limit) and its budget is resolved against the
limits and the KV capacity: one budget for Generate and Decode alike.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import structlog

from engine.errors import InvalidInput, OverCapacity
from engine.executor.facts import EngineFacts
from engine.executor.step import Driven
from engine.tokenizer import Tokenizer, TokenizerUnreadable
from service.calls import Prompt, Stopping
from service.errors import NoTokenizer, OverLimit

log = structlog.get_logger("ladder.server")
PROMPT_BYTES_PER_TOKEN = 32  # text and chat prompts: UTF-8 bytes allowed per allowed prompt token
CHAT_MESSAGE_BYTES = 32  # what each chat message counts beyond its role and content (the template's markup)


def chat_bytes(prompt: Prompt) -> int:
    """What a chat prompt counts against the prompt's byte limit: every message's role, content and
    tool calls, its markup (CHAT_MESSAGE_BYTES), and its tools' definitions."""
    chat = prompt.chat or ()
    messages = sum(
        len(m.role.encode())
        + len(m.content.encode())
        + CHAT_MESSAGE_BYTES
        + sum(len(c.name.encode()) + len(c.arguments.encode()) for c in m.tool_calls)
        for m in chat
    )
    tools = sum(
        len(t.name.encode()) + len(t.description.encode()) + len(t.parameters.encode()) for t in prompt.tools
    )
    return messages + tools


@dataclass(frozen=True)
class ModelSpec:
    """The served model's facts and the server's limits for it: what a ModelView is built from, in
    the server's process and in a frontend process (which reads the tokenizer from `name` itself)."""

    facts: EngineFacts
    name: str  # the model directory
    max_prompt_tokens: int  # 0: the capacity
    max_new_tokens: int
    default_new_tokens: int = 0  # 0: the limit
    api_names: tuple[str, ...] = ()  # the OpenAI API's id first; none: the directory's name


class ModelView:
    """The served model as a call's side sees it, with no engine: its facts, its tokenizer (or None)
    and the server's limits. What the servicer and the HTTP app need, in the server's process and in
    a frontend process alike."""

    def __init__(self, spec: ModelSpec, tokenizer: Tokenizer | None) -> None:
        self.spec = spec
        self.facts = facts = spec.facts
        self.tokenizer = tokenizer
        self.name = spec.name
        # The OpenAI API's id for it first, then the other names a request may use.
        self.api_names = spec.api_names or (Path(spec.name).name, spec.name)
        self.capacity = facts.capacity
        self.vocab_size = facts.vocab_size
        self.eos_ids = frozenset(facts.eos_ids)
        self.max_prompt_tokens = spec.max_prompt_tokens or self.capacity
        self.max_new_tokens = spec.max_new_tokens
        # What a request that names no max_new_tokens gets (0 configured: the limit), never over the limit.
        self.default_new_tokens = min(spec.default_new_tokens or spec.max_new_tokens, spec.max_new_tokens)

    def token_text(self, token: int) -> str:
        """One token's own text, special tokens written out ("" without a tokenizer)."""
        return "" if self.tokenizer is None else str(self.tokenizer.decode([token], skip_special=False))

    def piece(self, token: int) -> str:
        """One token's text as a generation shows it, special tokens left out ("" without a
        tokenizer): PrefillDone's preview of the next token."""
        return "" if self.tokenizer is None else self.tokenizer.decode([token])

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes one token stands for (a piece of a multi-byte character as it is; b"" without
        a tokenizer)."""
        return b"" if self.tokenizer is None else bytes(self.tokenizer.token_bytes(token))

    def text_decoder(self) -> Any:
        """A fresh streaming decoder of generated ids (special tokens left out), as the text is made;
        None without a tokenizer."""
        return None if self.tokenizer is None else self.tokenizer.stream(skip_special=True)

    def need_tokenizer(self, what: str) -> Any:
        if self.tokenizer is None:
            raise NoTokenizer(
                f"{what} needs a tokenizer and this model has none Ladder can read "
                "(see the server's start-up log); send token ids"
            )
        return self.tokenizer

    def detokenize(self, ids: list[int], field: str) -> str:
        """The text of token ids through the streaming decoder (special tokens left out), so it is
        exactly the text Generate streamed for them; Detokenize on gRPC and /detokenize on HTTP."""
        tokenizer = self.need_tokenizer("Detokenize")
        ids = self.check_ids(ids, field=field) if ids else []
        return "".join(tokenizer.stream(skip_special=True).pieces(ids))

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
                raise InvalidInput(
                    "a chat prompt needs at least one message",
                    reason="EMPTY_PROMPT",
                    field="prompt.chat.messages",
                )
            self._check_text_size(chat_bytes(prompt), "prompt.chat.messages")
            tokens = [int(t) for t in tokenizer.encode_chat(prompt.chat, tools=prompt.tools)]
        else:
            tokens = list(prompt.ids or ())  # Python ints already (the wire's repeated int32)
        return self.check_ids(tokens)

    def _check_text_size(self, size: int, field: str) -> None:
        limit = self.max_prompt_tokens * PROMPT_BYTES_PER_TOKEN
        if size > limit:
            raise OverLimit(
                f"the prompt text is {size} bytes; the limit is {limit} "
                f"({PROMPT_BYTES_PER_TOKEN} for each of {self.max_prompt_tokens} tokens)",
                reason="PROMPT_TOO_LONG",
                field=field,
            )

    def check_ids(self, tokens: list[int], field: str = "prompt.tokens.ids") -> list[int]:
        if not tokens:
            raise InvalidInput("the prompt is empty", reason="EMPTY_PROMPT", field="prompt")
        bad = next((t for t in tokens if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidInput(
                f"token id {bad} is outside the vocabulary of {self.vocab_size}",
                reason="TOKEN_OUT_OF_VOCABULARY",
                field=field,
            )
        if len(tokens) > self.max_prompt_tokens:
            raise OverLimit(
                f"the prompt has {len(tokens)} tokens; the limit is {self.max_prompt_tokens}",
                reason="PROMPT_TOO_LONG",
                field="prompt",
            )
        return tokens

    def asked_tokens(self, stopping: Stopping) -> int:
        """The new tokens a call asks for: its max_new_tokens, else the server's default (which the
        room left in the KV capacity may cut further: `budget`). What a response is sized for."""
        return stopping.max_new_tokens or self.default_new_tokens

    def budget(self, stopping: Stopping, past: int, held: str = "the prompt's") -> Stopping:
        """Resolve max_new_tokens against the limit and the room left after `past` tokens.

        The last new token is chosen from the logits of the one before it and needs no KV
        slot: a prompt of exactly the capacity still gets one token (finish reason CAPACITY).
        """
        room = self.capacity - past + 1
        if room < 1:
            raise OverCapacity(f"{held} {past} tokens exceed the KV capacity of {self.capacity}")
        wanted = self.asked_tokens(stopping)
        if wanted > self.max_new_tokens:
            raise OverLimit(
                f"max_new_tokens {wanted} is over the limit of {self.max_new_tokens}",
                reason="MAX_NEW_TOKENS_OVER_LIMIT",
                field="stopping.max_new_tokens",
            )
        if not stopping.max_new_tokens:  # the default: as many as fit, up to it
            wanted = min(wanted, room)
        if wanted > room:
            raise OverCapacity(
                f"{held} {past} tokens + {wanted} new tokens do not fit in the KV "
                f"capacity of {self.capacity}: at most {room} new tokens do"
            )
        if stopping.min_new_tokens > wanted:
            raise InvalidInput(
                f"min_new_tokens is {stopping.min_new_tokens}, over the {wanted} new tokens this call gets",
                reason="INVALID_MIN_TOKENS",
                field="stopping.min_new_tokens",
            )
        if stopping.stop:
            self.need_tokenizer("stop sequences")
        return replace(stopping, max_new_tokens=wanted)


class ServedModel(ModelView):
    """The loaded engine with the view of it every call shares (ModelView)."""

    def __init__(self, engine: Driven, tokenizer: Tokenizer | None, spec: ModelSpec) -> None:
        super().__init__(spec, tokenizer)
        self.engine = engine  # driven only through the scheduler's steps
        self.session_memory = 0  # bytes parked sessions may hold (0: parking off), set by loading
        self.draft_tokens = 0  # drafted tokens per verification forward (0: speculation off), set by loading
        self.forward_costs = engine.costs  # measured as the engine runs: how long a draft may be worth

    def lone(self) -> bool:
        """Whether the last decode forward ran one row (read on the worker): a stream decoding alone,
        whose drafts may get a verification forward of their own (speculation.Speculation)."""
        return self.engine.last_batch <= 1


def read_tokenizer(path: Path) -> Tokenizer | None:
    """The model's tokenizer; None (token-id prompts only, said once in the log) when it has
    none Ladder can read."""
    if not (path / "tokenizer.json").exists():
        log.warning("no_tokenizer", model=str(path), serving="token-id prompts only")
        return None
    try:
        return Tokenizer(path)
    except Exception as exc:  # noqa: BLE001 — whatever its files hold, the model still serves token ids
        reason = str(exc) if isinstance(exc, TokenizerUnreadable) else f"{type(exc).__name__}: {exc}"
        log.warning(
            "tokenizer_unreadable",
            model=str(path),
            reason=reason,
            serving="token-id prompts only: text, chat, Tokenize and Detokenize fail",
        )
        return None
