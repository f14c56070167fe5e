"""OpenAI's JSON into the typed calls gRPC's requests become (service/calls.py).

The one conversion layer of the HTTP API's requests: a body is read here into a GenerateCall per
prompt (a completions body may hold several: completions.py), checked as every call is as it is
built; the limits are the servicer's (LadderServicer.generation). A value of the wrong JSON type is
InvalidInput naming the OpenAI field. Answers are written back by answers.py. Nothing here touches
the network.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.chat_messages import ChatMessage
from engine.errors import InvalidInput
from engine.json_depth import MAX_JSON_DEPTH, check_json_depth
from engine.sampling import SamplingParams
from service.calls import ConstraintSpec, GenerateCall, LogprobRequest, Prompt, Stopping
from service.errors import ModelNotFound
from service.front.tool_calls import ToolRequest, tools_at_fault
from service.front.tool_formats import DEFAULT, FORMATS, ToolFormat
from service.http import tools as http_tools
from service.http.completions import completion_prompts

Json = dict[str, Any]
# Accepted for compatibility and refused when they ask for something Ladder does not do.
REFUSED_WHEN_SET = ("functions", "logit_bias", "suffix")  # functions: the legacy form of tools
GUIDED = {
    "guided_json": "json_schema",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}  # vLLM's structured-output extras
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
    names = {
        int: "an integer",
        float: "a number",
        bool: "a boolean",
        str: "a string",
        list: "an array",
        dict: "an object",
    }
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


def openai_call(
    body: Json, chat: bool, served: Sequence[str], tool_format: ToolFormat = FORMATS[DEFAULT]
) -> OpenAICall:
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
    speculate = _get(body, "speculate", bool, True)  # Ladder's extra: false = no drafts for this call
    generates = tuple(GenerateCall(p, ending, chosen, n, scored, constrained, speculate) for p in prompts)
    options = _get(body, "stream_options", dict, {})
    return OpenAICall(
        generates,
        chat,
        model,
        _get(body, "stream", bool, False),
        _get(options, "include_usage", bool, False),
        tools,
        echo,
    )


def served_model(body: Json, served: Sequence[str]) -> str:
    """The model a body names (none: the one served), or ModelNotFound."""
    model = _get(body, "model", str, "") or served[0]
    if model not in served:
        raise ModelNotFound(
            f"the model {model!r} is not served here; this server serves {served[0]!r}", field="model"
        )
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
        if not all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content
        ):
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
        raise _bad(
            f"min_tokens is {least}; it takes an integer from 0 to max_tokens"
            + (f" ({wanted})" if wanted else ""),
            "min_tokens",
        )
    return Stopping(
        wanted,
        tuple(stop),
        _get(body, "ignore_eos", bool, False),
        frozenset(ids),
        _get(body, "include_stop_str_in_output", bool, False),
        least,
    )


def sampling(body: Json) -> SamplingParams:
    """OpenAI's sampling values (temperature 1 unless given, as OpenAI) and vLLM's extras (top_k -1: off)."""
    top_k = _get(body, "top_k", int, 0)
    return SamplingParams(
        temperature=float(_get(body, "temperature", _NUMBER, 1.0)),
        top_k=0 if top_k == -1 else top_k,
        top_p=float(_get(body, "top_p", _NUMBER, 1.0)),
        min_p=float(_get(body, "min_p", _NUMBER, 0.0)),
        repetition_penalty=float(_get(body, "repetition_penalty", _NUMBER, 1.0)),
        seed=_get(body, "seed", int, None),
        presence_penalty=float(_get(body, "presence_penalty", _NUMBER, 0.0)),
        frequency_penalty=float(_get(body, "frequency_penalty", _NUMBER, 0.0)),
    )


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
            raise _bad(
                "tool_choice (required or a named function) and response_format (or guided_*, "
                "structured_outputs) both constrain the output",
                "tool_choice",
            )
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
            raise _bad(
                "structured_outputs and response_format (or a guided_*) both constrain the output",
                "structured_outputs",
            )
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
        raise _bad(
            f"structured_outputs.{unknown[0]} is not supported (json, regex, choice, grammar, json_object)",
            f"structured_outputs.{unknown[0]}",
        )
    if len(given) != 1:
        raise _bad(
            "structured_outputs takes exactly one of json, regex, choice, grammar, json_object",
            "structured_outputs",
        )
    ((key, item),) = given.items()
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
            raise _bad(
                "response_format.json_schema.schema takes a JSON Schema object",
                "response_format.json_schema.schema",
            )
        if strict is not None and not isinstance(strict, bool):
            raise _bad(
                "response_format.json_schema.strict takes a boolean", "response_format.json_schema.strict"
            )
        return ConstraintSpec("json_schema", text=json.dumps(schema), strict=strict)
    raise _bad(
        f"response_format.type {kind!r} is not one of text, json_object, json_schema", "response_format.type"
    )


def _guided(name: str, kind: str, value: Any) -> ConstraintSpec:
    if kind == "choice":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _bad(f"{name} takes an array of strings", name)
        return ConstraintSpec(kind, options=tuple(value))
    if kind == "json_schema" and isinstance(value, dict):
        value = json.dumps(value)
    if not isinstance(value, str):
        raise _bad(f"{name} takes a string", name)
    # vLLM's default backend (xgrammar, strict mode) writes no member a schema does not declare.
    return ConstraintSpec(kind, text=value, strict=True if kind == "json_schema" else None)


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
    return {
        "stopping.max_new_tokens": "max_tokens",
        "stopping.stop": "stop",
        "stopping.min_new_tokens": "min_tokens",
    }.get(field, field)
