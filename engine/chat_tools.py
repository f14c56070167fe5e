"""Tools in a chat prompt: what a template is given when it knows tools, and text when it does not.

A template that reads `tools` (Qwen2.5, Llama 3.1, Hermes, Mistral ...) is given them as transformers
gives them (OpenAI's tool objects), and an assistant turn's calls as `tool_calls` (HF's shape:
{"id", "type": "function", "function": {"name", "arguments"}}, the arguments a dict when they are a
JSON object, as those templates `tojson` them). A template that does not is given the same
information as text, so the model still sees it and nothing is dropped:
- the tools as a default system block (DEFAULT_TOOLS_BLOCK, Qwen2.5's own wording, Hermes's format),
  appended to the system turn or as a system turn of its own before the first;
- an assistant turn's calls appended to its content as `<tool_call>{"name", "arguments"}</tool_call>`
  (the format the block asks for);
- a `tool` turn, when the template never names that role, as a user turn holding
  `<tool_response>...</tool_response>` (as Qwen2.5's template writes it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.chat_messages import ChatMessage, FunctionTool, ToolCall

DEFAULT_TOOLS_BLOCK = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)
_NAMES_TOOLS = re.compile(r"\btools\b")
_NAMES_TOOL_ROLE = re.compile(r"""['"]tool['"]""")


@dataclass(frozen=True)
class ToolSupport:
    """What a template renders itself: `tools`, assistant `tool_calls`, turns of role "tool"."""

    tools: bool
    calls: bool
    tool_role: bool

    @classmethod
    def of(cls, source: str) -> ToolSupport:
        """Read from the template's text: a template that never names a variable cannot render it."""
        return cls(
            tools=bool(_NAMES_TOOLS.search(source)),
            calls="tool_calls" in source,
            tool_role=bool(_NAMES_TOOL_ROLE.search(source)),
        )


def turns(
    messages: Sequence[ChatMessage], tools: Sequence[FunctionTool], support: ToolSupport
) -> list[dict[str, Any]]:
    """The `messages` value a template is rendered with (the tools block added when it needs one)."""
    rendered = [_turn(m, support) for m in messages]
    if tools and not support.tools:
        rendered = with_tools_block(rendered, tools)
    return rendered


def tools_block(tools: Sequence[FunctionTool]) -> str:
    """The default system block describing `tools` and the call format (docs/api.md shows it)."""
    lines = "\n".join(json.dumps(t.template_value(), ensure_ascii=False) for t in tools)
    return DEFAULT_TOOLS_BLOCK.format(tools=lines)


def with_tools_block(rendered: list[dict[str, Any]], tools: Sequence[FunctionTool]) -> list[dict[str, Any]]:
    block = tools_block(tools)
    if rendered and rendered[0]["role"] == "system":
        first = rendered[0]
        content = f"{first['content']}\n\n{block}" if first["content"] else block
        return [{**first, "content": content}, *rendered[1:]]
    return [{"role": "system", "content": block}, *rendered]


def call_value(call: ToolCall) -> dict[str, Any]:
    """HF's tool call: arguments as a dict when they are a JSON object (templates `tojson` them)."""
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": arguments_value(call.arguments)},
    }


def arguments_value(arguments: str) -> Any:
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments


def textual_calls(content: str, calls: Sequence[ToolCall]) -> str:
    """An assistant turn's content with its calls written out in the default block's format."""
    written = [
        json.dumps({"name": c.name, "arguments": arguments_value(c.arguments)}, ensure_ascii=False)
        for c in calls
    ]
    parts = ([content] if content else []) + [f"<tool_call>\n{w}\n</tool_call>" for w in written]
    return "\n".join(parts)


def _turn(message: ChatMessage, support: ToolSupport) -> dict[str, Any]:
    if message.role == "tool" and not support.tool_role:
        return {"role": "user", "content": f"<tool_response>\n{message.content}\n</tool_response>"}
    turn: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        if support.calls:
            turn["tool_calls"] = [call_value(c) for c in message.tool_calls]
        else:
            turn["content"] = textual_calls(message.content, message.tool_calls)
    if message.tool_call_id:
        turn["tool_call_id"] = message.tool_call_id
    if message.name:
        turn["name"] = message.name
    return turn
