"""How a model family writes a tool call in free text (tool_choice "auto"), parsed back into calls.

A format reads a finished reply into the text before its calls and the calls (name, arguments as
JSON text), and says, while a reply streams, from where its text may be the start of a call (that
text is held back until the reply ends, then parsed). A reply it cannot read whole (a call that is
not JSON, a name that is no declared tool) is all text: never a half-parsed call.

Formats here:
- "hermes": Hermes / Qwen2.5 / Qwen3 and the default tools block (engine/chat_tools.py):
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one or more, after optional text.
- "llama3_json": Llama 3.1-3.3's JSON form: the whole reply is `{"name": ..., "parameters": {...}}`
  (or "arguments"), optionally after `<|python_tag|>`, several separated by ";".
- "mistral": Mistral's `[TOOL_CALLS]` followed by a JSON array of {"name", "arguments"} (the marker
  is a special token, left out of the text: then the reply is the array alone).
Special tokens are left out of a reply's text (`<|python_tag|>`, `[TOOL_CALLS]`), so each format
also reads its calls without its marker.

Adding one: write a class with `name`, `detects(template)`, `hold_from(text)` and `parse(text, names)`
(the ToolFormat protocol), and `register()` it; `--tool-call-format NAME` then selects it, and
"auto" picks the first registered format whose `detects` accepts the model's chat template.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Protocol

HEAD_CHARS = 256  # of a reply, what a format whose calls are the whole reply looks at while it streams


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # a JSON object's text


@dataclass(frozen=True)
class Parsed:
    """A reply read as the text before its calls (content) and its calls."""

    content: str
    calls: tuple[ParsedCall, ...]


class ToolFormat(Protocol):
    name: str

    def detects(self, template: str) -> bool:
        """Whether a chat template's text shows this is its model's format."""
        ...

    def hold_from(self, text: str) -> int | None:
        """Where in a reply so far a call may begin (hold it back while streaming); None: nowhere."""
        ...

    def parse(self, text: str, names: Collection[str]) -> Parsed | None:
        """The reply's content and calls (of tools named `names`); None: it holds no call."""
        ...


def call_of(value: Any, names: Collection[str], arguments_keys: tuple[str, ...]) -> ParsedCall | None:
    """A decoded {"name": ..., "<arguments key>": {...}} as a call of a declared tool, else None."""
    if not isinstance(value, dict) or value.get("name") not in names:
        return None
    arguments: Any = next((value[k] for k in arguments_keys if k in value), {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(str(value["name"]), json.dumps(arguments, ensure_ascii=False))


def partial_marker_at(text: str, marker: str) -> int | None:
    """Where `marker` starts in `text`, or where text ends with a prefix of it; None: neither."""
    found = text.find(marker)
    if found >= 0:
        return found
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return len(text) - size
    return None


class Hermes:
    name = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    _CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)

    def detects(self, template: str) -> bool:
        return self.OPEN in template

    def hold_from(self, text: str) -> int | None:
        return partial_marker_at(text, self.OPEN)

    def parse(self, text: str, names: Collection[str]) -> Parsed | None:
        start = text.find(self.OPEN)
        if start < 0:
            return None
        calls = []
        for match in self._CALL.finditer(text, start):
            try:
                call = call_of(json.loads(match.group(1)), names, ("arguments", "parameters"))
            except ValueError:
                return None
            if call is None:
                return None
            calls.append(call)
        return Parsed(text[:start].rstrip(), tuple(calls))


class Llama3Json:
    name = "llama3_json"
    TAG = "<|python_tag|>"

    def detects(self, template: str) -> bool:
        return self.TAG in template or ("<|start_header_id|>" in template and "tools" in template)

    def hold_from(self, text: str) -> int | None:
        head = text[:HEAD_CHARS].lstrip()  # a reply's start: not the whole reply again at every token
        if not head or head.startswith("{") or self.TAG.startswith(head[: len(self.TAG)]):
            return 0
        return None

    def parse(self, text: str, names: Collection[str]) -> Parsed | None:
        body = text.strip().removeprefix(self.TAG).strip()
        decoder = json.JSONDecoder()
        calls, at = [], 0
        while at < len(body):
            try:
                value, at = decoder.raw_decode(body, at)
            except ValueError:
                return None
            call = call_of(value, names, ("parameters", "arguments"))
            if call is None:
                return None
            calls.append(call)
            at = len(body) - len(body[at:].lstrip().removeprefix(";").lstrip())
        return Parsed("", tuple(calls)) if calls else None


class Mistral:
    name = "mistral"
    TAG = "[TOOL_CALLS]"

    def detects(self, template: str) -> bool:
        return self.TAG in template

    def hold_from(self, text: str) -> int | None:
        head = text[:HEAD_CHARS].lstrip()
        if not head or head.startswith("[{") or self.TAG.startswith(head[: len(self.TAG)]):
            return 0
        return None

    def parse(self, text: str, names: Collection[str]) -> Parsed | None:
        body = text.strip().removeprefix(self.TAG).strip()
        try:
            values = json.loads(body)
        except ValueError:
            return None
        if not isinstance(values, list):
            return None
        calls = [call_of(v, names, ("arguments", "parameters")) for v in values]
        found = tuple(c for c in calls if c is not None)
        return Parsed("", found) if found and len(found) == len(calls) else None


FORMATS: dict[str, ToolFormat] = {}


def register(tool_format: ToolFormat) -> ToolFormat:
    FORMATS[tool_format.name] = tool_format
    return tool_format


register(Hermes())
register(Llama3Json())
register(Mistral())
DEFAULT = "hermes"  # the format the default tools block asks for (a template with no tools of its own)
AUTO = "auto"


def format_for(template: str | None, configured: str = AUTO) -> ToolFormat:
    """The configured format (--tool-call-format), or on "auto" the first whose `detects` accepts the
    model's chat template, else DEFAULT."""
    if configured != AUTO:
        return FORMATS[configured]
    found = next((f for f in FORMATS.values() if template and f.detects(template)), None)
    return found or FORMATS[DEFAULT]
