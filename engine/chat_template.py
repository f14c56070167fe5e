"""Chat prompts rendered from the model's own template, the way transformers renders them.

Owns: finding the template (`chat_template.jinja`, else `chat_template` in
tokenizer_config.json: a string, or a list of named templates of which
"default" is taken), rendering it in jinja2's immutable sandbox with the names
transformers provides (`messages`, `add_generation_prompt`, `bos_token`,
`eos_token`, `raise_exception`, `strftime_now`, `tools`, a `tojson` that keeps
non-ASCII), and ChatML when the model has no template at all. Tools
(engine/chat_tools.py): a template that reads `tools` gets them; one that does
not gets them as a default system block, and assistant tool calls and `tool`
results as text, so a conversation with tools is never rendered without them.
Guarantees: a template that raises (`raise_exception`, an undefined name, a
sandbox refusal) or that leaves a message out of the prompt (a role it has no
place for) is the request's fault: InvalidInput, never a wrong
prompt sent on silently. A template that does not compile fails at load.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine import chat_tools
from engine.chat_messages import ChatMessage, FunctionTool
from engine.errors import InvalidInput

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


class TemplateUnusable(Exception):
    """The model's chat template does not compile (raised at load, not per request)."""


def template_source(model_dir: Path, config: Mapping[str, Any]) -> str | None:
    """The model's own chat template text (None: it has none)."""
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    declared = config.get("chat_template")
    if isinstance(declared, list):  # named templates, as transformers writes several
        named = {t.get("name"): t.get("template") for t in declared if isinstance(t, Mapping)}
        declared = named.get("default")
    return declared if isinstance(declared, str) and declared else None


def token_text(entry: object) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(entry, Mapping):
        entry = entry.get("content")
    return entry if isinstance(entry, str) else None


class ChatTemplate:
    """One compiled template and the special-token names it is rendered with."""

    def __init__(self, source: str | None, config: Mapping[str, Any]) -> None:
        self.own = source is not None
        self.source = source if source is not None else CHATML
        self.tool_support = chat_tools.ToolSupport.of(self.source)
        self.specials = {name: token_text(config.get(name)) or "" for name in SPECIAL_NAMES}
        try:
            self._template = _environment().from_string(self.source)
        except jinja2.TemplateError as exc:
            raise TemplateUnusable(f"the chat template does not compile: {exc}") from exc

    @classmethod
    def of(cls, model_dir: Path, config: Mapping[str, Any]) -> ChatTemplate:
        return cls(template_source(model_dir, config), config)

    def render(
        self,
        messages: Iterable[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[FunctionTool] = (),
    ) -> str:
        """The prompt text; InvalidInput when the template refuses the conversation. `tools` reach
        the template's `tools` (or, when it has none, a default system block: engine/chat_tools.py)."""
        turns = chat_tools.turns(list(messages), tools, self.tool_support)
        values = [t.template_value() for t in tools] if tools and self.tool_support.tools else None
        text = self._render(turns, add_generation_prompt, values)
        for index, turn in enumerate(turns):
            if self._dropped(text, turns, index, add_generation_prompt, values):
                raise InvalidInput(
                    f"the model's chat template has no place for a message of role {turn['role']!r}"
                )
        return text

    def _render(
        self,
        turns: list[dict[str, Any]],
        add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        try:
            return self._template.render(
                messages=turns,
                add_generation_prompt=add_generation_prompt,
                tools=tools,
                documents=None,
                **self.specials,
            )
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError) as exc:
            raise InvalidInput(f"the model's chat template refused the conversation: {exc}") from exc

    def _dropped(
        self,
        text: str,
        turns: list[dict[str, Any]],
        index: int,
        add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None,
    ) -> bool:
        """Whether the template left turn `index` out (it has no branch for its role): dropping a
        message silently would change the conversation. A content found in the prompt is kept;
        one that is not (a template may trim or rewrite it) is dropped only if the prompt
        renders the same without it."""
        content = str(turns[index]["content"] or "").strip()
        if not content or content in text:
            return False
        try:
            return self._render(turns[:index] + turns[index + 1 :], add_generation_prompt, tools) == text
        except InvalidInput:  # without it the template refuses: it mattered
            return False


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # transformers' tojson: non-ASCII kept, no HTML escaping (jinja2's own escapes '<' and '>').
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env
