"""Chat prompts from the model's own template, as transformers renders it, in jinja2's sandbox."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.chat_messages import ChatMessage
from engine.chat_template import CHATML, ChatTemplate, TemplateUnusable, template_source
from engine.errors import InvalidInput

DATA = json.loads((Path(__file__).parent / "data" / "chat_templates.json").read_text(encoding="utf-8"))


def template_of(model: str) -> ChatTemplate:
    entry = DATA["models"][model]
    return ChatTemplate(entry["template"], entry["tokens"])


def turns(messages: list[dict[str, str]]) -> list[ChatMessage]:
    return [ChatMessage(m["role"], m["content"]) for m in messages]


@pytest.mark.parametrize("case", DATA["cases"], ids=lambda c: f"{c['model']}-{len(c['messages'])}")
def test_each_public_template_renders_its_models_expected_prompt(case: dict[str, Any]) -> None:
    rendered = template_of(case["model"]).render(
        turns(case["messages"]), add_generation_prompt=case["add_generation_prompt"]
    )
    assert rendered == case["prompt"]


def test_a_role_the_template_has_no_place_for_is_refused_not_dropped() -> None:
    phi3 = template_of("Phi-3-mini-4k-instruct")  # renders nothing for a "function" turn
    with pytest.raises(InvalidInput, match="role 'function'"):
        phi3.render([ChatMessage("user", "Hi"), ChatMessage("function", "42")])
    # A "tool" turn, which it never names either, is written as a user turn (engine/chat_tools.py).
    assert "<tool_response>\n42\n</tool_response>" in phi3.render(
        [ChatMessage("user", "Hi"), ChatMessage("tool", "42")]
    )


def test_raise_exception_in_a_template_is_the_requests_fault() -> None:
    template = ChatTemplate(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}"
        "{% endif %}{{ messages[0]['content'] }}",
        {},
    )
    with pytest.raises(InvalidInput, match="user first"):
        template.render([ChatMessage("assistant", "Hello")])


def test_the_sandbox_refuses_what_a_template_may_not_touch() -> None:
    template = ChatTemplate("{{ messages.__class__.__mro__ }}{{ messages[0]['content'] }}", {})
    with pytest.raises(InvalidInput):
        template.render([ChatMessage("user", "Hi")])
    mutating = ChatTemplate("{{ messages.append(1) }}{{ messages[0]['content'] }}", {})
    with pytest.raises(InvalidInput):
        mutating.render([ChatMessage("user", "Hi")])


def test_a_template_that_does_not_compile_is_refused_at_load() -> None:
    with pytest.raises(TemplateUnusable):
        ChatTemplate("{% for message in messages %}", {})


def test_tojson_keeps_non_ascii_and_angle_brackets_as_transformers_does() -> None:
    template = ChatTemplate("{{ messages | tojson }}", {})
    text = template.render([ChatMessage("user", "café <b>")], add_generation_prompt=False)
    assert text == '[{"role": "user", "content": "café <b>"}]'


def test_the_template_comes_from_the_jinja_file_then_the_named_default_then_none(tmp_path: Path) -> None:
    named = {"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}
    assert template_source(tmp_path, named) == "D"
    assert template_source(tmp_path, {"chat_template": "S"}) == "S"
    assert template_source(tmp_path, {}) is None
    (tmp_path / "chat_template.jinja").write_text("J")
    assert template_source(tmp_path, {"chat_template": "S"}) == "J"


def test_a_model_without_a_template_is_rendered_as_chatml() -> None:
    template = ChatTemplate(None, {})
    assert (template.own, template.source) == (False, CHATML)
    rendered = template.render([ChatMessage("user", "Hi")])
    assert rendered == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_a_turn_the_template_rewrites_is_kept_not_taken_for_a_dropped_one() -> None:
    # As Qwen3's template does: an assistant turn's reasoning is cut from the history.
    template = ChatTemplate(
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'].split('</think>')[-1] }}\n{% endfor %}", {}
    )
    turns = [ChatMessage("user", "Hi"), ChatMessage("assistant", "<think>hmm</think>Hello")]
    assert template.render(turns) == "user: Hi\nassistant: Hello\n"
