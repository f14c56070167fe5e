"""Tool calling on a chat call: what tool_choice constrains, and the calls read back from the reply.

- "none": the reply is text (the tools still reach the template, as vLLM gives them).
- "auto": the model writes text or calls in its family's format (service/front/tool_formats.py), read
  back when it ends; while it streams, text that may begin a call is held back until then.
- named ({"type": "function", "function": {"name": ...}}): the reply is constrained to that tool's
  parameters schema (the call's arguments), so it is always one well-formed call of that tool.
- "required": the reply is constrained to {"name": <a tool's name>, "arguments": <its parameters>}
  (an array of at least one of them when parallel_tool_calls), so it is always one or more
  well-formed calls of declared tools.
A constrained reply cut short (max_tokens) is not a call: it comes back as text, finish "length".
Nothing here knows HTTP: service/http/tools.py reads OpenAI's fields and writes its shapes.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from engine.chat_messages import FunctionTool
from engine.errors import RequestError
from service.calls import ConstraintSpec
from service.errors import request_field
from service.front.tool_formats import Parsed, ParsedCall, ToolFormat

NONE, AUTO, REQUIRED, NAMED = "none", "auto", "required", "named"
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for a function's name
EMPTY_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolChoice:
    mode: str  # NONE, AUTO, REQUIRED or NAMED
    name: str = ""  # the tool a NAMED choice calls


@dataclass(frozen=True)
class ToolRequest:
    """A chat call's tools, the choice among them, and the format the model writes calls in."""

    tools: tuple[FunctionTool, ...]
    choice: ToolChoice
    parallel: bool
    format: ToolFormat

    @property
    def names(self) -> frozenset[str]:
        return frozenset(t.name for t in self.tools)

    @property
    def active(self) -> bool:
        """Whether the reply is read for calls (any choice but "none")."""
        return self.choice.mode != NONE

    @property
    def constrained(self) -> bool:
        """Whether the choice constrains the reply (required and named)."""
        return self.choice.mode in (REQUIRED, NAMED)

    def constraint(self) -> ConstraintSpec | None:
        """The constraint a named or required choice puts on the reply; None for none and auto."""
        # Read as strict mode reads a schema (no arguments the tool does not declare, unless its
        # schema says additionalProperties), as vLLM's structured-output engines read tools' schemas.
        if self.choice.mode == NAMED:
            schema = parameters_of(self.tool(self.choice.name))
            return ConstraintSpec("json_schema", text=json.dumps(schema), strict=True)
        if self.choice.mode == REQUIRED:
            schema = required_schema(self.tools, self.parallel)
            return ConstraintSpec("json_schema", text=json.dumps(schema), strict=True)
        return None

    def tool(self, name: str) -> FunctionTool:
        return next(t for t in self.tools if t.name == name)

    def read(self, text: str) -> Parsed | None:
        """The calls in a finished reply (None: it is text)."""
        if self.choice.mode == NAMED:
            return _named(self.choice.name, text)
        if self.choice.mode == REQUIRED:
            return _required(text, self.names)
        if self.choice.mode == AUTO:
            return self.format.parse(text, self.names)
        return None


@contextmanager
def tools_at_fault(tools: ToolRequest | None, field: str) -> Iterator[None]:
    """A constraint a tool_choice made that cannot be compiled (a parameters schema outside the
    engine's subset) is the fault of the tools (`field`), not of a constraint the caller never set."""
    try:
        yield
    except RequestError as exc:
        if tools is not None and tools.constrained and request_field(exc.field).startswith("constraint"):
            exc.field = field
        raise


def call_id() -> str:
    return "call_" + secrets.token_hex(12)


def parameters_of(tool: FunctionTool) -> Any:
    return json.loads(tool.parameters) if tool.parameters else EMPTY_PARAMETERS


def required_schema(tools: tuple[FunctionTool, ...], parallel: bool) -> dict[str, Any]:
    """One call of any tool ({"name": const, "arguments": its parameters}), or an array of at least one
    when parallel. Each tool's parameters move under $defs (their local $refs rewritten to point
    there), so schemas with $defs of their own (pydantic's) keep resolving."""
    defs = {f"tool{i}": _rebased(parameters_of(t), f"#/$defs/tool{i}") for i, t in enumerate(tools)}
    calls = [
        {
            "type": "object",
            "properties": {"name": {"const": t.name}, "arguments": {"$ref": f"#/$defs/tool{i}"}},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for i, t in enumerate(tools)
    ]
    one: dict[str, Any] = calls[0] if len(calls) == 1 else {"anyOf": calls}
    if parallel:
        return {"type": "array", "items": one, "minItems": 1, "$defs": defs}
    return {**one, "$defs": defs}


def _rebased(schema: Any, base: str) -> Any:
    """`schema` with every local $ref ("#...") made relative to `base` ("#/$defs/toolN")."""
    if isinstance(schema, dict):
        return {
            k: (
                base + v[1:]
                if k == "$ref" and isinstance(v, str) and v.startswith("#")
                else _rebased(v, base)
            )
            for k, v in schema.items()
        }
    if isinstance(schema, list):
        return [_rebased(v, base) for v in schema]
    return schema


def _named(name: str, text: str) -> Parsed | None:
    try:
        arguments = json.loads(text)
    except ValueError:
        return None
    return Parsed("", (ParsedCall(name, json.dumps(arguments, ensure_ascii=False)),))


def _required(text: str, names: frozenset[str]) -> Parsed | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    values = value if isinstance(value, list) else [value]
    calls = []
    for item in values:
        if not isinstance(item, dict) or item.get("name") not in names:
            return None
        calls.append(ParsedCall(item["name"], json.dumps(item.get("arguments", {}), ensure_ascii=False)))
    return Parsed("", tuple(calls)) if calls else None


@dataclass(frozen=True)
class Delta:
    """One piece of a streamed reply: text, or a part of call `call` (its id and name on its first)."""

    content: str = ""
    call: int | None = None
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass
class ToolStream:
    """One sample's streamed reply read for calls, piece by piece. A named call streams its arguments
    as they come; a required reply is held until it ends (it is read whole: one call or several);
    an auto reply streams as text until it may start a call (the format's hold_from), then holds
    (trailing whitespace is held too)."""

    request: ToolRequest
    text: str = ""  # the reply so far
    sent: int = 0  # characters of it already given out as content (auto) or arguments (named)
    calls: int = 0  # calls given out
    ids: list[str] = field(default_factory=list)

    def feed(self, piece: str) -> list[Delta]:
        self.text += piece
        mode = self.request.choice.mode
        if mode == NAMED:
            return list(self._named_pieces())
        if mode == AUTO:
            held = self.request.format.hold_from(self.text)
            end = len(self.text) if held is None else max(held, self.sent)
            # Trailing whitespace waits too: before a call it is not content (the unstreamed reply's isn't).
            return self._content(self.sent + len(self.text[self.sent : end].rstrip()))
        return []

    def finish(self) -> list[Delta]:
        """What is left when the reply ends: the held text read as calls, or given out as text."""
        mode = self.request.choice.mode
        if mode == NAMED:
            if self.calls == 0 and self.text == "":
                return []
            return list(self._named_pieces())
        if mode not in (REQUIRED, AUTO):
            return []
        parsed = self.request.read(self.text[self.sent :]) if self.text[self.sent :] else None
        if parsed is None:
            return self._content(len(self.text))
        out = [Delta(content=parsed.content)] if parsed.content else []
        self.sent = len(self.text)
        for call in parsed.calls:
            out.extend(self._whole_call(call))
        return out

    def _content(self, upto: int) -> list[Delta]:
        if upto <= self.sent:
            return []
        piece, self.sent = self.text[self.sent : upto], upto
        return [Delta(content=piece)]

    def _named_pieces(self) -> Iterator[Delta]:
        if self.calls == 0:
            self.calls = 1
            self.ids.append(call_id())
            yield Delta(call=0, id=self.ids[0], name=self.request.choice.name)
        if len(self.text) > self.sent:
            yield Delta(call=0, arguments=self.text[self.sent :])
            self.sent = len(self.text)

    def _whole_call(self, call: ParsedCall) -> list[Delta]:
        index = self.calls
        self.calls += 1
        self.ids.append(call_id())
        return [
            Delta(call=index, id=self.ids[-1], name=call.name),
            Delta(call=index, arguments=call.arguments),
        ]
