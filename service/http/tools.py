"""OpenAI's tool fields read into a ToolRequest (service/front/tool_calls.py), and calls written back.

Read here: `tools` (function tools only: name of 1-64 of a-z A-Z 0-9 _ -, unique; description; parameters
a JSON Schema object; strict), `tool_choice` ("none", "auto", "required" or {"type": "function",
"function": {"name": ...}} naming a declared tool; none of them but "none" without tools) and
`parallel_tool_calls` (default true), and an assistant message's `tool_calls`. Every refusal is
InvalidInput (INVALID_FIELD) naming the field, as the rest of the OpenAI layer's.
"""

from __future__ import annotations

import json
from typing import Any

from engine.chat_messages import FunctionTool, ToolCall
from engine.errors import InvalidInput
from service.front.tool_calls import AUTO, NAMED, NONE, REQUIRED, TOOL_NAME, Delta, ToolChoice, ToolRequest
from service.front.tool_formats import Parsed, ToolFormat

Json = dict[str, Any]
CHOICES = (NONE, AUTO, REQUIRED)


def _bad(message: str, field: str) -> InvalidInput:
    return InvalidInput(message, reason="INVALID_FIELD", field=field)


def tool_request(body: Json, tool_format: ToolFormat) -> ToolRequest | None:
    """The body's tools and choice; None when it has neither (or only tool_choice "none")."""
    tools = read_tools(body.get("tools"))
    choice = read_choice(body.get("tool_choice"), tools)
    parallel = body.get("parallel_tool_calls", True)
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        raise _bad("parallel_tool_calls takes a boolean", "parallel_tool_calls")
    if not tools:
        return None
    return ToolRequest(tools, choice, parallel, tool_format)


def read_tools(value: Any) -> tuple[FunctionTool, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _bad("tools takes an array of tools", "tools")
    tools = tuple(_tool(item, f"tools[{i}]") for i, item in enumerate(value))
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if tool.name in seen:
            raise _bad(f"tools[{i}]: a second function named {tool.name!r}", f"tools[{i}].function.name")
        seen.add(tool.name)
    return tools


def _tool(item: Any, where: str) -> FunctionTool:
    if not isinstance(item, dict):
        raise _bad(f"{where} takes a tool object", where)
    if item.get("type", "function") != "function":
        raise _bad(
            f"{where}.type {item.get('type')!r} is not supported: only function tools are", f"{where}.type"
        )
    function = item.get("function")
    if not isinstance(function, dict):
        raise _bad(f"{where}.function takes an object with the function's name", f"{where}.function")
    name = function.get("name")
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise _bad(f"{where}.function.name takes 1 to 64 of a-z, A-Z, 0-9, _ and -", f"{where}.function.name")
    description = function.get("description") or ""
    if not isinstance(description, str):
        raise _bad(f"{where}.function.description takes a string", f"{where}.function.description")
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise _bad(f"{where}.function.parameters takes a JSON Schema object", f"{where}.function.parameters")
    strict = function.get("strict") or False
    if not isinstance(strict, bool):
        raise _bad(f"{where}.function.strict takes a boolean", f"{where}.function.strict")
    return FunctionTool(name, description, json.dumps(parameters) if parameters is not None else "", strict)


def read_choice(value: Any, tools: tuple[FunctionTool, ...]) -> ToolChoice:
    """tool_choice: absent means "auto" with tools and "none" without, as OpenAI has it."""
    if value is None:
        return ToolChoice(AUTO if tools else NONE)
    if isinstance(value, str):
        if value not in CHOICES:
            raise _bad(
                f"tool_choice {value!r} is not one of none, auto, required or a named function", "tool_choice"
            )
        choice = ToolChoice(value)
    elif isinstance(value, dict) and value.get("type") == "function":
        function = value.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            raise _bad(
                "tool_choice.function takes an object with the function's name", "tool_choice.function"
            )
        if name not in {t.name for t in tools}:
            raise _bad(f"tool_choice names the function {name!r}, which is not in tools", "tool_choice")
        choice = ToolChoice(NAMED, name)
    else:
        raise _bad(
            'tool_choice takes "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
            "tool_choice",
        )
    if choice.mode != NONE and not tools:
        raise _bad(f"tool_choice {choice.mode!r} needs tools", "tool_choice")
    return choice


def message_calls(message: Json, field: str) -> tuple[ToolCall, ...]:
    """An assistant message's tool_calls (arguments as the JSON text OpenAI sends, or an object)."""
    calls = message.get("tool_calls")
    if calls is None:
        return ()
    if not isinstance(calls, list):
        raise _bad(f"{field}.tool_calls takes an array of tool calls", f"{field}.tool_calls")
    return tuple(_call(call, f"{field}.tool_calls[{i}]") for i, call in enumerate(calls))


def _call(call: Any, where: str) -> ToolCall:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise _bad(f'{where} takes {{"id", "type": "function", "function": {{"name", "arguments"}}}}', where)
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, dict):
        arguments = json.dumps(arguments, ensure_ascii=False)
    if not isinstance(arguments, str):
        raise _bad(f"{where}.function.arguments takes a JSON string", f"{where}.function.arguments")
    call_id = call.get("id") or ""
    if not isinstance(call_id, str):
        raise _bad(f"{where}.id takes a string", f"{where}.id")
    return ToolCall(call_id, function["name"], arguments)


def message_of(parsed: Parsed, ids: list[str]) -> Json:
    """The assistant message of a reply read as calls (content null when it has none)."""
    calls = [
        {"id": call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for call_id, c in zip(ids, parsed.calls, strict=True)
    ]
    return {"role": "assistant", "content": parsed.content or None, "refusal": None, "tool_calls": calls}


def delta_of(delta: Delta) -> Json:
    """A streamed delta: content, or a call's part (its first with id, type and name, arguments "")."""
    if delta.call is None:
        return {"content": delta.content}
    part: Json = {"index": delta.call}
    if delta.id:
        part.update(id=delta.id, type="function", function={"name": delta.name, "arguments": ""})
    else:
        part["function"] = {"arguments": delta.arguments}
    return {"tool_calls": [part]}
