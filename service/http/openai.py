"""OpenAI's JSON into the typed calls gRPC's requests become (service/calls.py), and results back.

The one conversion layer of the HTTP API: a body is read here into a GenerateCall per prompt (a
completions body may hold several), checked as every call is as it is built; the limits are the
servicer's (LadderServicer.generation). A value of the wrong JSON type is InvalidInput naming the
OpenAI field. Answers are written back in OpenAI's shapes: a choice per sample of each prompt,
echoed prompts and their log-probabilities, streamed chunks. Nothing here touches the network.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from engine.chat_template import ChatMessage
from engine.errors import InvalidInput
from engine.json_depth import MAX_JSON_DEPTH, check_json_depth
from engine.sampling import SamplingParams, TokenLogprobs
from service.calls import ConstraintSpec, GenerateCall, LogprobRequest, Prompt, Stopping
from service.errors import ModelNotFound
from service.events import Finish, Finished, PromptLogprobs, TokenOut
from service.http import tools as http_tools
from service.progress import Progress, SampleRecord
from service.tool_calls import ToolRequest, ToolStream, call_id, tools_at_fault
from service.tool_formats import DEFAULT, FORMATS, ToolFormat

Json = dict[str, Any]
class TokenText(Protocol):
    """A token's own text (special tokens written out), the raw bytes it stands for, and a decoder of
    ids into the text they make (ServedModel's)."""

    def token_text(self, token: int) -> str: ...

    def token_bytes(self, token: int) -> bytes: ...

    def text_decoder(self) -> Any: ...
FINISH = {Finish.LENGTH: "length", Finish.CAPACITY: "length", Finish.EOS: "stop", Finish.STOP: "stop"}
# Accepted for compatibility and refused when they ask for something Ladder does not do.
REFUSED_WHEN_SET = ("functions", "logit_bias", "suffix")  # functions: the legacy form of tools
GUIDED = {"guided_json": "json_schema", "guided_regex": "regex", "guided_choice": "choice",
          "guided_grammar": "grammar"}  # vLLM's structured-output extras
_NUMBER = (int, float)


@dataclass(frozen=True)
class OpenAICall:
    """A completions or chat completions request: the typed calls (one per prompt: a completions
    `prompt` may be a list), and how their answer is written."""

    generates: tuple[GenerateCall, ...]
    chat: bool
    model: str
    stream: bool = False
    include_usage: bool = False
    tools: ToolRequest | None = None  # chat with tools: the reply is read for calls (tool_choice)
    echo: bool = False  # completions: each choice's text starts with its prompt's

    @property
    def generate(self) -> GenerateCall:
        """The first prompt's call (every prompt's asks for the same n, logprobs, stopping)."""
        return self.generates[0]

    @property
    def n(self) -> int:
        return self.generate.n


MAX_EXACT_INT = 2**53  # the integers a double holds exactly (what every OpenAI client's JSON can carry)
INT32_MAX = 2**31 - 1  # token ids on the wire (the .proto's int32)


def _bad(message: str, field: str) -> InvalidInput:
    return InvalidInput(message, reason="INVALID_FIELD", field=field)


def _get(body: Json, name: str, kinds: type | tuple[type, ...], default: Any) -> Any:
    """body[name] when it is of `kinds` (a bool is no number), `default` when absent or null."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, kinds) and not (isinstance(value, bool) and bool not in _tuple(kinds)):
        return value
    raise _bad(f"{name} is {type(value).__name__}; it takes {_noun(kinds)}", name)


def _tuple(kinds: type | tuple[type, ...]) -> tuple[type, ...]:
    return kinds if isinstance(kinds, tuple) else (kinds,)


def _noun(kinds: type | tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", bool: "a boolean", str: "a string", list: "an array",
             dict: "an object"}
    return " or ".join(names.get(k, k.__name__) for k in _tuple(kinds))


def read_body(data: bytes) -> Json:
    """The request's JSON object, or InvalidInput (MALFORMED_REQUEST; JSON_TOO_DEEP past MAX_JSON_DEPTH
    levels, measured before the parser recurses into it)."""
    check_json_depth(data, MAX_JSON_DEPTH)
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"the body is not JSON: {exc}", reason="MALFORMED_REQUEST") from None
    if not isinstance(body, dict):
        raise InvalidInput("the body is not a JSON object", reason="MALFORMED_REQUEST")
    check_values(body, "")
    return body


def check_values(value: Any, where: str) -> None:
    """Every number in the body is finite and within a double's exact integers (json accepts NaN,
    Infinity and 400-digit integers, which later fail float() or int32), every string is Unicode a
    tokenizer can encode (json accepts lone surrogates such as \\ud800): else a 400 naming the field."""
    if isinstance(value, dict):
        for key, item in value.items():
            check_values(item, f"{where}.{key}" if where else key)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_values(item, f"{where}[{i}]")
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int) and abs(value) > MAX_EXACT_INT:
        raise _bad(f"{where} is out of range (at most {MAX_EXACT_INT} in magnitude)", where)
    elif isinstance(value, float) and not math.isfinite(value):
        raise _bad(f"{where} is not a finite number", where)
    elif isinstance(value, str) and not _encodable(value):
        raise _bad(f"{where} holds a lone UTF-16 surrogate, which is not a Unicode character", where)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def openai_call(body: Json, chat: bool, served: Sequence[str],
                tool_format: ToolFormat = FORMATS[DEFAULT]) -> OpenAICall:
    """The call a /v1/completions (`chat` False) or /v1/chat/completions body asks for. `served`:
    the names of the one model served, its id first; a body that names none means it. `tool_format`:
    how the model writes tool calls (tool_choice "auto")."""
    model = served_model(body, served)
    if not chat and body.get("tools"):
        raise _bad("tools are served on /v1/chat/completions", "tools")
    for name in REFUSED_WHEN_SET:
        if body.get(name):
            raise _bad(f"{name} is not supported by Ladder's OpenAI-compatible API", name)
    echo = not chat and _get(body, "echo", bool, False)
    n = _get(body, "n", int, 1)
    if n < 1 or _get(body, "best_of", int, n) != n:
        raise _bad("n must be at least 1 (best_of, when given, equal to n)", "n")
    tools = http_tools.tool_request(body, tool_format) if chat else None
    if chat:
        prompts = [Prompt(chat=chat_messages(body), tools=tools.tools if tools is not None else ())]
    else:
        prompts = completion_prompts(body.get("prompt"))
    with tools_at_fault(tools, "tools"):  # a call schema over the constraint limit
        constrained = constraint(body, tools)
    ending, chosen, scored = stopping(body, chat), sampling(body), logprobs(body, chat, echo)
    generates = tuple(GenerateCall(p, ending, chosen, n, scored, constrained) for p in prompts)
    options = _get(body, "stream_options", dict, {})
    return OpenAICall(generates, chat, model, _get(body, "stream", bool, False),
                      _get(options, "include_usage", bool, False), tools, echo)


def served_model(body: Json, served: Sequence[str]) -> str:
    """The model a body names (none: the one served), or ModelNotFound."""
    model = _get(body, "model", str, "") or served[0]
    if model not in served:
        raise ModelNotFound(f"the model {model!r} is not served here; this server serves {served[0]!r}",
                            field="model")
    return served[0]


def tokenize_prompt(body: Json, served: Sequence[str]) -> Prompt:
    """vLLM's /tokenize body: `prompt` (text), or chat `messages` through the chat template."""
    served_model(body, served)
    if "messages" in body:
        return Prompt(chat=chat_messages(body), tools=http_tools.read_tools(body.get("tools")))
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise _bad("prompt takes a string (or send messages)", "prompt")
    return Prompt(text=prompt)


def detokenize_ids(body: Json, served: Sequence[str]) -> list[int]:
    """vLLM's /detokenize body: `tokens`, a list of token ids."""
    served_model(body, served)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
        raise _bad("tokens takes an array of token ids", "tokens")
    return tokens


MAX_PROMPTS = 64  # prompts of one completions request (each its own call; the worker holds 64 by default)


def completion_prompts(value: Any) -> list[Prompt]:
    """The prompts of a completions body: a string, an array of token ids, or an array of either
    (a batch: one call per prompt, choices in the batch's order)."""
    one = _one_prompt(value)
    if one is not None:
        return [one]
    if not isinstance(value, list) or not value:
        raise _bad("prompt takes a string, an array of token ids, or an array of those", "prompt")
    if len(value) > MAX_PROMPTS:
        raise _bad(f"prompt holds {len(value)} prompts; at most {MAX_PROMPTS} are taken at once", "prompt")
    prompts = [_one_prompt(item) for item in value]
    bad = next((i for i, p in enumerate(prompts) if p is None), None)
    if bad is not None:
        raise _bad(f"prompt[{bad}] takes a string or an array of token ids", f"prompt[{bad}]")
    return [p for p in prompts if p is not None]


def _one_prompt(value: Any) -> Prompt | None:
    """A prompt as text or (a non-empty array of) token ids; None for anything else."""
    if isinstance(value, str):
        return Prompt(text=value)
    if isinstance(value, list) and value and all(type(t) is int for t in value):
        return Prompt(ids=tuple(value))
    return None


def chat_messages(body: Json) -> tuple[ChatMessage, ...]:
    messages = _get(body, "messages", list, None)
    if not messages:
        raise _bad("messages takes a non-empty array of messages", "messages")
    return tuple(_message(m, f"messages[{i}]") for i, m in enumerate(messages))


def _message(message: Any, field: str) -> ChatMessage:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise _bad(f"{field} takes an object with a role", field)
    content = message.get("content")
    if isinstance(content, list):  # parts: only text parts are served
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise _bad(f"{field}.content: only text parts are supported", f"{field}.content")
        content = "".join(p["text"] for p in content)
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise _bad(f"{field}.content takes a string or an array of text parts", f"{field}.content")
    answers = message.get("tool_call_id") or ""  # a tool message: the call whose result it is
    name = message.get("name") or ""
    if not isinstance(answers, str) or not isinstance(name, str):
        raise _bad(f"{field}.tool_call_id and {field}.name take strings", f"{field}.tool_call_id")
    return ChatMessage(message["role"], content, http_tools.message_calls(message, field), answers, name)


def stopping(body: Json, chat: bool) -> Stopping:
    """max_tokens (chat: max_completion_tokens first; none: the server's default), stop, and vLLM's
    ignore_eos, stop_token_ids and include_stop_str_in_output."""
    names = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",)
    name = next((k for k in names if body.get(k) is not None), None)
    wanted = 0 if name is None else _get(body, name, int, 0)
    if name is not None and wanted < 1:
        raise _bad(f"{name} must be at least 1", name)
    stop = _get(body, "stop", (str, list), ())
    stop = (stop,) if isinstance(stop, str) else stop
    if not all(isinstance(s, str) for s in stop):
        raise _bad("stop takes a string or an array of strings", "stop")
    ids = _get(body, "stop_token_ids", list, [])
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= INT32_MAX for t in ids):
        raise _bad("stop_token_ids takes an array of token ids (integers from 0)", "stop_token_ids")
    least = _get(body, "min_tokens", int, 0)
    if least < 0 or (wanted and least > wanted):
        raise _bad(f"min_tokens is {least}; it takes an integer from 0 to max_tokens"
                   + (f" ({wanted})" if wanted else ""), "min_tokens")
    return Stopping(wanted, tuple(stop), _get(body, "ignore_eos", bool, False), frozenset(ids),
                    _get(body, "include_stop_str_in_output", bool, False), least)


def sampling(body: Json) -> SamplingParams:
    """OpenAI's sampling values (temperature 1 unless given, as OpenAI) and vLLM's extras (top_k -1: off)."""
    top_k = _get(body, "top_k", int, 0)
    return SamplingParams(
        temperature=float(_get(body, "temperature", _NUMBER, 1.0)), top_k=0 if top_k == -1 else top_k,
        top_p=float(_get(body, "top_p", _NUMBER, 1.0)), min_p=float(_get(body, "min_p", _NUMBER, 0.0)),
        repetition_penalty=float(_get(body, "repetition_penalty", _NUMBER, 1.0)),
        seed=_get(body, "seed", int, None),
        presence_penalty=float(_get(body, "presence_penalty", _NUMBER, 0.0)),
        frequency_penalty=float(_get(body, "frequency_penalty", _NUMBER, 0.0)))


def logprobs(body: Json, chat: bool, echo: bool = False) -> LogprobRequest | None:
    """Chat: `logprobs` true, with `top_logprobs` alternatives; completions: `logprobs` alternatives
    (with `echo`, the prompt's tokens' too)."""
    if not chat:
        top = _get(body, "logprobs", int, None)
        return None if top is None else LogprobRequest(top, prompt=echo)
    if not _get(body, "logprobs", bool, False):
        if body.get("top_logprobs"):
            raise _bad("top_logprobs needs logprobs: true", "top_logprobs")
        return None
    return LogprobRequest(_get(body, "top_logprobs", int, 0))


def constraint(body: Json, tools: ToolRequest | None = None) -> ConstraintSpec | None:
    """response_format (json_object: any JSON object; json_schema: its schema), a vLLM guided_* extra,
    or the calls a required or named tool_choice asks for (one of them at most)."""
    found = constraint_of_format(_get(body, "response_format", dict, {}))
    called = tools.constraint() if tools is not None else None
    if called is not None:
        if found is not None or any(body.get(k) is not None for k in (*GUIDED, "structured_outputs")):
            raise _bad("tool_choice (required or a named function) and response_format (or guided_*, "
                       "structured_outputs) both constrain the output", "tool_choice")
        return called
    for name, kind in GUIDED.items():
        value = body.get(name)
        if value is None:
            continue
        if found is not None:
            raise _bad(f"{name} and response_format (or another guided_*) both constrain the output", name)
        found = _guided(name, kind, value)
    outputs = body.get("structured_outputs")
    if outputs is not None:
        if found is not None:
            raise _bad("structured_outputs and response_format (or a guided_*) both constrain the output",
                       "structured_outputs")
        found = structured_outputs(outputs)
    return found


# vLLM's current request field (its guided_* extras' successor): one of these keys.
STRUCTURED = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar"}


def structured_outputs(value: Any) -> ConstraintSpec:
    """vLLM's `structured_outputs`: exactly one of json (a schema), regex, choice, grammar, or
    json_object true; any other key set is refused (it would constrain in a way not honoured)."""
    if not isinstance(value, dict):
        raise _bad("structured_outputs takes an object", "structured_outputs")
    given = {k: v for k, v in value.items() if v is not None and v is not False}
    unknown = sorted(set(given) - set(STRUCTURED) - {"json_object"})
    if unknown:
        raise _bad(f"structured_outputs.{unknown[0]} is not supported (json, regex, choice, grammar, "
                   "json_object)", f"structured_outputs.{unknown[0]}")
    if len(given) != 1:
        raise _bad("structured_outputs takes exactly one of json, regex, choice, grammar, json_object",
                   "structured_outputs")
    (key, item), = given.items()
    if key == "json_object":
        return ConstraintSpec("json_schema", text='{"type": "object"}')
    return _guided(f"structured_outputs.{key}", STRUCTURED[key], item)


def constraint_of_format(response_format: Json) -> ConstraintSpec | None:
    kind = response_format.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return ConstraintSpec("json_schema", text='{"type": "object"}')
    if kind == "json_schema":
        named = _get(response_format, "json_schema", dict, {})
        schema, strict = named.get("schema"), named.get("strict")
        if not isinstance(schema, dict):
            raise _bad("response_format.json_schema.schema takes a JSON Schema object",
                       "response_format.json_schema.schema")
        if strict is not None and not isinstance(strict, bool):
            raise _bad("response_format.json_schema.strict takes a boolean",
                       "response_format.json_schema.strict")
        return ConstraintSpec("json_schema", text=json.dumps(schema), strict=strict)
    raise _bad(f"response_format.type {kind!r} is not one of text, json_object, json_schema",
               "response_format.type")


def _guided(name: str, kind: str, value: Any) -> ConstraintSpec:
    if kind == "choice":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _bad(f"{name} takes an array of strings", name)
        return ConstraintSpec(kind, options=tuple(value))
    if kind == "json_schema" and isinstance(value, dict):
        value = json.dumps(value)
    if not isinstance(value, str):
        raise _bad(f"{name} takes a string", name)
    return ConstraintSpec(kind, text=value)


def param_of(field: str, chat: bool) -> str:
    """The OpenAI parameter a Ladder request field is read from (service/calls.py names its own)."""
    if field.startswith("sampling."):
        return field.removeprefix("sampling.")
    if field.startswith("constraint"):
        return "response_format"
    if field.startswith("prompt"):
        return "messages" if chat else "prompt"
    if field == "logprobs.top":
        return "top_logprobs" if chat else "logprobs"
    return {"stopping.max_new_tokens": "max_tokens", "stopping.stop": "stop",
            "stopping.min_new_tokens": "min_tokens"}.get(field, field)


# -- answers ------------------------------------------------------------------------------------------

def usage(progresses: Sequence[Progress]) -> Json:
    """Tokens over every prompt of the call and every sample of each."""
    prompt = sum(p.prompt_tokens for p in progresses)
    completion = sum(p.generated for p in progresses)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _alternative(token: int, logprob: float, tokens: TokenText) -> Json:
    """OpenAI's token entry: `bytes` are the token's own bytes (a piece of a multi-byte character
    included, whose text alone is U+FFFD), so a reply's tokens' bytes join to its text's."""
    return {"token": tokens.token_text(token), "logprob": logprob, "bytes": list(tokens.token_bytes(token))}


def chat_logprobs(found: list[TokenLogprobs], tokens: TokenText) -> Json:
    return {"content": [{**_alternative(t.token, t.logprob, tokens),
                         "top_logprobs": [_alternative(i, v, tokens) for i, v in t.top]} for t in found],
            "refusal": None}  # OpenAI's schema requires it (the model never refuses by a field here)


@dataclass(frozen=True)
class Echo:
    """A prompt as a completions choice echoes it: its text (as sent, or its token ids' text) and
    its token ids."""

    text: str
    ids: tuple[int, ...]


# One token of the legacy logprobs layout: its id, log-probability and alternatives (None for
# none: the first token of an echoed prompt, which nothing before it predicts).
Entry = tuple[int, float | None, tuple[tuple[int, float], ...] | None]


def entries_of(found: Sequence[TokenLogprobs]) -> list[Entry]:
    return [(t.token, t.logprob, t.top) for t in found]


def prompt_entries(echo: Echo, found: Sequence[TokenLogprobs]) -> list[Entry]:
    """An echoed prompt's tokens: the first with no log-probability (OpenAI's and vLLM's null), then
    the prefill's log-probabilities of the others (PromptLogprobs)."""
    return [(echo.ids[0], None, None), *entries_of(found)]


def legacy_logprobs(entries: Sequence[Entry], offsets: Sequence[int], tokens: TokenText) -> Json:
    """The completions layout: tokens, their log-probabilities, the top alternatives, and where
    each token's text starts in the choice's text (`offsets`)."""
    return {"tokens": [tokens.token_text(token) for token, _, _ in entries],
            "token_logprobs": [logprob for _, logprob, _ in entries],
            "top_logprobs": [None if top is None else {tokens.token_text(i): v for i, v in top}
                             for _, _, top in entries],
            "text_offset": list(offsets)}


class Offsets:
    """Where each token's text starts in a choice's text: the characters its earlier tokens
    decoded to (the streaming decoder's text, a character split over tokens starting where its
    first byte's token does), after `start` (an echoed prompt), never past `end` (a stop string cut
    the text short)."""

    def __init__(self, tokens: TokenText, start: int = 0, end: int | None = None) -> None:
        self.decoder = tokens.text_decoder()
        self.at = start
        self.end = end

    def of(self, token: int) -> int:
        """The offset of `token`, the next one; the decoder moves past it."""
        offset = self.at if self.end is None else min(self.at, self.end)
        if self.decoder is not None:
            self.at += len(self.decoder.push(token))
        return offset

    def all(self, ids: Sequence[int]) -> list[int]:
        return [self.of(token) for token in ids]


@dataclass(frozen=True)
class Answer:
    """How one call's answer is written: its id, creation time and model, chat or not, and each
    prompt as echoed (completions with echo)."""

    call: OpenAICall
    request_id: str
    created: int
    tokens: TokenText
    echoes: tuple[Echo, ...] = ()

    @property
    def id(self) -> str:
        return ("chatcmpl-" if self.call.chat else "cmpl-") + self.request_id

    def _head(self, chunk: bool) -> Json:
        kind = "chat.completion" if self.call.chat else "text_completion"
        return {"id": self.id, "object": kind + (".chunk" if chunk and self.call.chat else ""),
                "created": self.created, "model": self.call.model}

    def echoed(self, prompt: int) -> str:
        """The text a choice of prompt `prompt` starts with: the prompt's with echo, else none."""
        return self.echoes[prompt].text if self.call.echo else ""

    def whole(self, progresses: Sequence[Progress]) -> Json:
        """The non-streaming answer: every sample of every prompt as a choice (indexed prompt * n +
        sample, as OpenAI's), and the usage of them all."""
        n = self.call.n
        choices = [self._choice(p * n + i, record, p, progress.prompt_logprobs)
                   for p, progress in enumerate(progresses)
                   for i, record in enumerate(progress.sample_records())]
        return {**self._head(False), "choices": choices, "usage": usage(progresses)}

    def _choice(self, index: int, record: SampleRecord, prompt: int,
                prompt_found: Sequence[TokenLogprobs]) -> Json:
        reason = FINISH[record.finished.reason] if record.finished is not None else None
        choice: Json = {"index": index, "finish_reason": reason, "logprobs": None}
        if self.call.chat:
            if self.call.generate.logprobs is not None:
                choice["logprobs"] = chat_logprobs(record.logprobs, self.tokens)
            choice["message"] = {"role": "assistant", "content": record.text, "refusal": None}
            parsed = self.call.tools.read(record.text) if self.call.tools is not None else None
            if parsed is not None and parsed.calls:
                choice["message"] = http_tools.message_of(parsed, [call_id() for _ in parsed.calls])
                choice["finish_reason"] = "tool_calls" if reason == "stop" else reason
            return choice
        echoed = self.echoed(prompt)
        choice["text"] = echoed + record.text
        if self.call.generate.logprobs is not None:
            entries, offsets = [], []
            if self.call.echo:
                echo = self.echoes[prompt]
                entries = prompt_entries(echo, prompt_found)
                offsets = Offsets(self.tokens, 0, len(echo.text)).all(echo.ids)
            entries += entries_of(record.logprobs)
            offsets += Offsets(self.tokens, len(echoed), len(choice["text"])).all(
                [t.token for t in record.logprobs])
            choice["logprobs"] = legacy_logprobs(entries, offsets, self.tokens)
        return choice

    def delta_chunk(self, index: int, delta: Json, found: list[TokenLogprobs] | None = None,
                    finish_reason: str | None = None) -> Json:
        """A chat chunk of choice `index` carrying `delta` (content or a tool call's part)."""
        choice: Json = {"index": index, "logprobs": chat_logprobs(found, self.tokens) if found else None,
                        "finish_reason": finish_reason, "delta": delta}
        return {**self._head(True), "choices": [choice]}

    def chunk(self, index: int, text: str, *, logprobs: Json | None = None, finish: Finish | None = None,
              role: bool = False) -> Json:
        """One streamed chunk of choice `index`: its next text (a role first, on chat), or its finish
        (the chunk of its last text, or one with none, and no chunk after it)."""
        choice: Json = {"index": index, "logprobs": logprobs,
                        "finish_reason": FINISH[finish] if finish is not None else None}
        if self.call.chat:
            choice["delta"] = {"role": "assistant", "content": text} if role else (
                {} if finish is not None and not text else {"content": text})
        else:
            choice["text"] = text
        return {**self._head(True), "choices": [choice]}

    def usage_chunk(self, progresses: Sequence[Progress]) -> Json:
        return {**self._head(True), "choices": [], "usage": usage(progresses)}


class Chunks:
    """The streamed chunks of one call, event by event: each sample's text, logprobs, finish. Events
    come tagged with their prompt: a choice is prompt * n + sample."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.offsets: dict[int, Offsets] = {}  # per choice: completions' text_offset
        tools = answer.call.tools
        self.tools = ToolChunks(answer) if tools is not None and tools.active else None

    def opening(self) -> list[Json]:
        """Chat: every choice's role, before any text; completions with echo (and no logprobs, whose
        prompt part comes with the prompt's log-probabilities): every choice's prompt."""
        call = self.answer.call
        if call.chat:
            return [self.answer.chunk(i, "", role=True) for i in range(call.n)]
        if call.echo and call.generate.logprobs is None:
            return [chunk for p in range(len(call.generates)) for chunk in self._echo(p, ())]
        return []

    def of(self, event: Any, prompt: int = 0) -> list[Json]:
        if self.tools is not None:
            return self.tools.of(event)
        answer, n = self.answer, self.answer.call.n
        if isinstance(event, PromptLogprobs) and answer.call.echo:
            return self._echo(prompt, event.logprobs)
        if isinstance(event, TokenOut):
            index = prompt * n + event.sample
            logprobs = None
            if event.logprobs is not None:
                offset = self._offsets(index, prompt).of(event.id)
                logprobs = self._logprobs([event.logprobs], [offset])
            return [answer.chunk(index, event.text, logprobs=logprobs)]
        if isinstance(event, Finished):
            return [answer.chunk(prompt * n + event.sample, event.tail, finish=event.reason)]
        return []

    def _logprobs(self, found: list[TokenLogprobs], offsets: list[int]) -> Json:
        if self.answer.call.chat:
            return chat_logprobs(found, self.answer.tokens)
        return legacy_logprobs(entries_of(found), offsets, self.answer.tokens)

    def _offsets(self, index: int, prompt: int) -> Offsets:
        found = self.offsets.get(index)
        if found is None:
            found = self.offsets[index] = Offsets(self.answer.tokens, len(self.answer.echoed(prompt)))
        return found

    def _echo(self, prompt: int, found: Sequence[TokenLogprobs]) -> list[Json]:
        """Each choice of `prompt`'s first chunk: the prompt's text (and its tokens' log-probabilities)."""
        answer, n = self.answer, self.answer.call.n
        echo = answer.echoes[prompt]
        logprobs = None
        if answer.call.generate.logprobs is not None:
            offsets = Offsets(answer.tokens, 0, len(echo.text)).all(echo.ids)
            logprobs = legacy_logprobs(prompt_entries(echo, found), offsets, answer.tokens)
        return [answer.chunk(prompt * n + i, echo.text, logprobs=logprobs) for i in range(n)]


class ToolChunks:
    """The streamed chunks of a chat call read for tool calls: each sample's reply through a ToolStream
    (service/tool_calls.py), as content and `delta.tool_calls` chunks the SDKs accumulate. The
    log-probabilities of text held back go out with the next chunk of that sample."""

    def __init__(self, answer: Answer) -> None:
        assert answer.call.tools is not None
        self.answer = answer
        self.request = answer.call.tools
        self.streams: dict[int, ToolStream] = {}
        self.pending: dict[int, list[TokenLogprobs]] = {}

    def of(self, event: Any) -> list[Json]:
        if isinstance(event, TokenOut):
            if event.logprobs is not None:
                self.pending.setdefault(event.sample, []).append(event.logprobs)
            return self._chunks(event.sample, self._stream(event.sample).feed(event.text))
        if isinstance(event, Finished):
            stream = self._stream(event.sample)
            chunks = self._chunks(event.sample, stream.feed(event.tail) + stream.finish())
            reason = FINISH[event.reason]
            if stream.calls and reason == "stop":
                reason = "tool_calls"
            found = self.pending.pop(event.sample, None)
            chunks.append(self.answer.delta_chunk(event.sample, {}, found, reason))
            return chunks
        return []

    def _stream(self, sample: int) -> ToolStream:
        return self.streams.setdefault(sample, ToolStream(self.request))

    def _chunks(self, sample: int, deltas: list[Any]) -> list[Json]:
        chunks = []
        for delta in deltas:
            found = self.pending.pop(sample, None)
            chunks.append(self.answer.delta_chunk(sample, http_tools.delta_of(delta), found))
        return chunks
