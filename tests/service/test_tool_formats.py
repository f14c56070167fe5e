"""Tool calling's parts that need no model: the call formats read back from scripted replies (Hermes,
Llama 3.x JSON, one added through the registry), a streamed reply read piece by piece, the schema a
required choice constrains the reply to, and the prompt a template renders with tools and a history
of calls (a template that knows tools, and one that does not)."""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

import jsonschema
import pytest

from engine.chat_messages import ChatMessage, FunctionTool, ToolCall
from engine.chat_template import CHATML, ChatTemplate
from engine.chat_tools import DEFAULT_TOOLS_BLOCK
from service.front import tool_formats
from service.front.tool_calls import (
    AUTO,
    NAMED,
    REQUIRED,
    Delta,
    ToolChoice,
    ToolRequest,
    ToolStream,
    required_schema,
)
from service.front.tool_formats import FORMATS, Hermes, Llama3Json, Mistral, Parsed, ParsedCall, format_for

WEATHER = FunctionTool(
    "get_weather",
    "The weather in a city",
    json.dumps({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
)
ADD = FunctionTool(
    "add",
    "Add two integers",
    json.dumps(
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        }
    ),
)
NAMES = {"get_weather", "add"}
PARIS = ParsedCall("get_weather", '{"city": "Paris"}')
ONE_TWO = {"a": 1, "b": 2}
ADDED = ParsedCall("add", '{"a": 1, "b": 2}')


def hermes_call(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


# -- formats ------------------------------------------------------------------------------------------


def test_hermes_reads_the_text_before_the_calls_and_every_call() -> None:
    text = (
        "Let me look.\n" + hermes_call("get_weather", {"city": "Paris"}) + "\n" + hermes_call("add", ONE_TWO)
    )
    assert Hermes().parse(text, NAMES) == Parsed("Let me look.", (PARIS, ADDED))


def test_hermes_reads_a_last_call_left_unclosed_and_arguments_written_as_a_string() -> None:
    unclosed = '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}'
    assert Hermes().parse(unclosed, NAMES) == Parsed("", (PARIS,))


@pytest.mark.parametrize(
    "text",
    [
        "The weather in Paris is mild.",  # no call
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',  # cut short: not JSON
        hermes_call("launch_rockets", {}),  # no such tool
        '<tool_call>\n["get_weather"]\n</tool_call>',  # not a call object
    ],
)
def test_hermes_reads_no_call_from_a_reply_it_cannot_read_whole(text: str) -> None:
    assert Hermes().parse(text, NAMES) is None


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
        '  {"name": "get_weather", "arguments": {"city": "Paris"}}\n',
    ],
)
def test_llama3_json_reads_a_whole_reply_that_is_a_call(text: str) -> None:
    assert Llama3Json().parse(text, NAMES) == Parsed("", (PARIS,))


def test_llama3_json_reads_calls_separated_by_semicolons() -> None:
    text = (
        '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "add", "parameters": '
        '{"a": 1, "b": 2}}'
    )
    assert Llama3Json().parse(text, NAMES) == Parsed("", (PARIS, ADDED))


@pytest.mark.parametrize(
    "text",
    [
        "Paris is sunny.",
        'Sure: {"name": "get_weather", "parameters": {}}',
        '{"name": "nope", "parameters": {}}',
        '{"city": "Paris"}',
        "",
    ],
)
def test_llama3_json_reads_no_call_from_text(text: str) -> None:
    assert Llama3Json().parse(text, NAMES) is None


@pytest.mark.parametrize(
    "text",
    [
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        '[{"name": "get_weather", "arguments": {"city": "Paris"}}]',  # the marker, a special token, left out
    ],
)
def test_mistral_reads_its_array_of_calls(text: str) -> None:
    assert Mistral().parse(text, NAMES) == Parsed("", (PARIS,))
    assert Mistral().hold_from(text[:3]) == 0


@pytest.mark.parametrize("text", ["[1, 2]", '[{"name": "nope", "arguments": {}}]', "[]", "Sunny."])
def test_mistral_reads_no_call_from_text(text: str) -> None:
    assert Mistral().parse(text, NAMES) is None


def test_streaming_holds_back_from_where_a_call_may_begin() -> None:
    hermes, llama = Hermes(), Llama3Json()
    assert hermes.hold_from("Hello") is None
    assert hermes.hold_from("Hello <tool") == 6  # may become <tool_call>
    assert hermes.hold_from("Hello <tool_call>{") == 6
    assert hermes.hold_from("a <b") is None
    assert llama.hold_from(' {"name"') == 0 and llama.hold_from("<|python") == 0
    assert llama.hold_from("Paris") is None
    assert Mistral().hold_from("[1, 2]") is None and Mistral().hold_from("Sunny") is None


def test_the_format_is_the_configured_one_else_the_templates_else_hermes() -> None:
    assert format_for("{{ '<tool_call>' }}").name == "hermes"
    assert format_for("{{ '<|python_tag|>' }}").name == "llama3_json"
    assert format_for("{{ '[TOOL_CALLS]' }}").name == "mistral"
    assert format_for(CHATML).name == "hermes" and format_for(None).name == "hermes"
    assert format_for(CHATML, "llama3_json").name == "llama3_json"


class Bracketed:
    """A made-up format: `[[name {json}]]`, to show how one is added."""

    name = "bracketed"

    def detects(self, template: str) -> bool:
        return "[[" in template

    def hold_from(self, text: str) -> int | None:
        return tool_formats.partial_marker_at(text, "[[")

    def parse(self, text: str, names: Collection[str]) -> Parsed | None:
        start = text.find("[[")
        if start < 0 or not text.rstrip().endswith("]]"):
            return None
        name, _, arguments = text[start + 2 :].rstrip()[:-2].partition(" ")
        call = tool_formats.call_of({"name": name, "arguments": json.loads(arguments)}, names, ("arguments",))
        return Parsed(text[:start].rstrip(), (call,)) if call is not None else None


def test_a_format_added_to_the_registry_is_selected_by_name_and_by_template() -> None:
    tool_formats.register(Bracketed())
    try:
        assert format_for(CHATML, "bracketed").name == "bracketed"
        assert format_for("{{ '[[' }}").name == "bracketed"
        parsed = FORMATS["bracketed"].parse('Ok. [[get_weather {"city": "Paris"}]]', NAMES)
        assert parsed == Parsed("Ok.", (PARIS,))
    finally:
        del FORMATS["bracketed"]


# -- streamed replies ---------------------------------------------------------------------------------


def request(mode: str, name: str = "", parallel: bool = True, fmt: str = "hermes") -> ToolRequest:
    return ToolRequest((WEATHER, ADD), ToolChoice(mode, name), parallel, FORMATS[fmt])


def streamed(stream: ToolStream, pieces: list[str]) -> list[Delta]:
    deltas = [d for piece in pieces for d in stream.feed(piece)]
    return deltas + stream.finish()


def test_an_auto_reply_streams_its_text_and_holds_a_call_until_it_ends() -> None:
    stream = ToolStream(request(AUTO))
    pieces = [
        "I will ",
        "check <tool",
        '_call>\n{"name": "get_weather", ',
        '"arguments": {"city": "Paris"}}\n</tool_call>',
    ]
    assert stream.feed(pieces[0]) == [Delta(content="I will")]  # a space may come before a call: held
    assert stream.feed(pieces[1]) == [Delta(content=" check")]
    assert stream.feed(pieces[2]) == [] and stream.feed(pieces[3]) == []
    end = stream.finish()
    assert end[0].call == 0 and end[0].name == "get_weather" and end[0].id.startswith("call_")
    assert end[1:] == [Delta(call=0, arguments='{"city": "Paris"}')]


def test_an_auto_reply_that_only_looked_like_a_call_is_given_out_as_text() -> None:
    deltas = streamed(ToolStream(request(AUTO)), ["See <to", "mato> and <tool_call>{oops"])
    assert "".join(d.content for d in deltas) == "See <tomato> and <tool_call>{oops"
    assert all(d.call is None for d in deltas)


def test_a_llama3_auto_reply_is_held_from_its_first_brace() -> None:
    stream = ToolStream(request(AUTO, fmt="llama3_json"))
    assert stream.feed('{"name": "add", ') == []
    end = stream.feed('"parameters": {"a": 1, "b": 2}}') + stream.finish()
    assert [(d.call, d.name, d.arguments) for d in end] == [(0, "add", ""), (0, "", '{"a": 1, "b": 2}')]


def test_a_named_call_streams_its_arguments_as_they_come() -> None:
    stream = ToolStream(request(NAMED, "add"))
    first = stream.feed('{"a": ')
    assert [(d.call, d.name, d.arguments) for d in first] == [(0, "add", ""), (0, "", '{"a": ')]
    assert stream.feed('1, "b": 2}') == [Delta(call=0, arguments='1, "b": 2}')] and stream.finish() == []


def test_a_required_reply_is_read_whole_as_one_or_more_calls() -> None:
    text = json.dumps(
        [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "add", "arguments": ONE_TWO}]
    )
    deltas = streamed(ToolStream(request(REQUIRED)), [text[:20], text[20:]])
    heads = [d for d in deltas if d.id]
    assert [(d.call, d.name) for d in heads] == [(0, "get_weather"), (1, "add")]
    assert len({d.id for d in heads}) == 2
    assert [d.arguments for d in deltas if d.arguments] == ['{"city": "Paris"}', '{"a": 1, "b": 2}']


# -- the constraint of a required choice --------------------------------------------------------------

POINT = {
    "type": "object",
    "properties": {"at": {"$ref": "#/$defs/Point"}},
    "required": ["at"],
    "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
}


@pytest.mark.parametrize("parallel", [True, False])
def test_a_required_schema_takes_calls_of_declared_tools_with_their_own_defs(parallel: bool) -> None:
    tools = (WEATHER, FunctionTool("place", "", json.dumps(POINT)))
    schema = required_schema(tools, parallel)
    calls = [
        {"name": "place", "arguments": {"at": {"x": 3}}},
        {"name": "get_weather", "arguments": {"city": "Oslo"}},
    ]
    good: Any = calls if parallel else calls[0]
    jsonschema.validate(good, schema)  # pydantic's $defs resolve under their new home
    wrong_type = {"name": "place", "arguments": {"at": {"x": "3"}}}
    unknown = {"name": "other", "arguments": {}}
    for bad in ([wrong_type], [unknown], []):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad if parallel else (bad or [{}])[0], schema)


# -- prompts ------------------------------------------------------------------------------------------

TOOL_TEMPLATE = """{%- if tools %}<|im_start|>system
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "assistant" and message.tool_calls %}<|im_start|>assistant
{%- for tool_call in message.tool_calls %}
{%- set tool_call = tool_call.function %}
<tool_call>{"name": "{{ tool_call.name }}", "arguments": {{ tool_call.arguments | tojson }}}</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == "tool" %}<|im_start|>user
<tool_response>{{ message.content }}</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
HISTORY = [
    ChatMessage("user", "Weather in Paris?"),
    ChatMessage("assistant", "", (ToolCall("call_1", "get_weather", '{"city": "Paris"}'),)),
    ChatMessage("tool", "18 C and sunny", tool_call_id="call_1"),
]


def test_a_template_that_knows_tools_gets_them_and_the_calls_as_transformers_passes_them() -> None:
    text = ChatTemplate(TOOL_TEMPLATE, {}).render(HISTORY, tools=[WEATHER])
    assert '"name": "get_weather", "description": "The weather in a city"' in text
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in text  # a dict
    assert "<tool_response>18 C and sunny</tool_response>" in text
    assert "You may call one or more functions" not in text  # no default block beside its own


def test_a_template_without_tools_gets_the_default_block_and_the_calls_as_text() -> None:
    text = ChatTemplate(CHATML, {}).render([ChatMessage("system", "Be brief."), *HISTORY], tools=[WEATHER])
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions")
    assert json.dumps(WEATHER.template_value()) in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call><|im_end|>" in text
    )
    assert "<|im_start|>user\n<tool_response>\n18 C and sunny\n</tool_response><|im_end|>" in text
    alone = ChatTemplate(CHATML, {}).render(HISTORY[:1], tools=[WEATHER])
    assert alone.startswith("<|im_start|>system\n" + DEFAULT_TOOLS_BLOCK.split("{tools}")[0])


def test_a_history_of_calls_is_rendered_without_tools_declared_too() -> None:
    text = ChatTemplate(CHATML, {}).render(HISTORY)
    assert '"arguments": {"city": "Paris"}' in text and "18 C and sunny" in text and "# Tools" not in text
