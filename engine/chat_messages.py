"""What a chat prompt is made of: its turns, the tool calls an assistant turn made, and the functions
a model may call (engine/chat_template.py renders them; engine/chat_tools.py writes tools as text for a
template that does not know them)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    """A function call an assistant turn made: its id, the function's name, its arguments (JSON text)."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class FunctionTool:
    """A function the model may call: name, description and parameters (JSON Schema text; "" none)."""

    name: str
    description: str = ""
    parameters: str = ""
    strict: bool = False

    def template_value(self) -> dict[str, Any]:
        """What transformers passes a template for it (OpenAI's tool object)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = (
            json.loads(self.parameters) if self.parameters else {"type": "object", "properties": {}}
        )
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ChatMessage:
    """One turn. An assistant's may hold the tool calls it made; a `tool` turn answers `tool_call_id`."""

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    name: str = ""
