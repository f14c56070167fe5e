"""Tool calling on /v1/chat/completions through a real server on the default model (int4), driven
by the official openai SDK (and LangChain's ChatOpenAI and instructor's TOOLS, TOOLS_STRICT and
PARALLEL_TOOLS modes, from the dev extra; gRPC's Generate too): tool_choice required and
named give well-formed calls of declared tools every time, streamed and not, whose arguments
validate against the tool's parameters; pydantic_function_tool's strict tools parse back into their
models; a history of calls and results reaches the prompt; "auto" reads calls from the model's own
text (forced here with a one-option constraint, so the text is known); bad tools are 400s naming
the field."""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import grpc
import jsonschema
import openai
import pydantic
import pytest

from proto.ladder.v1 import ladder_pb2 as pb
from service.config import Config
from tests.support.rich_errors import details_of
from tests.support.servers import RunningServer, free_port, server_config

WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
NUMBER = {"type": "integer", "minimum": 0, "maximum": 1000}
ADD_PARAMETERS = {
    "type": "object",
    "properties": {"a": NUMBER, "b": NUMBER},
    "required": ["a", "b"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city",
            "parameters": WEATHER_PARAMETERS,
        },
    },
    {
        "type": "function",
        "function": {"name": "add", "description": "Add two whole numbers", "parameters": ADD_PARAMETERS},
    },
]
PARAMETERS = {"get_weather": WEATHER_PARAMETERS, "add": ADD_PARAMETERS}
ASK: list[Any] = [{"role": "user", "content": "What is the weather like in Paris today?"}]
SUM: list[Any] = [{"role": "user", "content": "What is 12 plus 30?"}]
NAMED_ADD = {"type": "function", "function": {"name": "add"}}
MAX_NEW = 120
HISTORY: list[Any] = [
    *ASK,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_abc",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_abc", "content": "18 degrees and sunny"},
]


def tools_config(default_model: Callable[..., Path]) -> Config:
    """The tool tests' server (tests/clients/test_node_openai_sdk.py's too): the default model (int4),
    HTTP on, a few sessions."""
    return server_config(
        default_model("int4"), http_port=free_port(), max_sessions=4, capacity=2048, chunk_size=64
    )


@pytest.fixture(scope="module")
def server(default_model: Callable[..., Path]) -> Iterator[RunningServer]:
    with RunningServer(tools_config(default_model)) as running:
        yield running


@pytest.fixture(scope="module")
def sdk(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"http://127.0.0.1:{server.config.http_port}/v1", api_key="none", max_retries=0, timeout=120
    )


def post(server: RunningServer, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", server.config.http_port, timeout=120)
    connection.request("POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, json.loads(response.read())


def create(sdk: openai.OpenAI, **asked: Any) -> Any:
    return sdk.chat.completions.create(model="", **{"max_tokens": MAX_NEW, **asked})


def assert_valid_call(name: str, arguments: str, call_id: str | None = "call_") -> None:
    assert name in PARAMETERS
    jsonschema.validate(json.loads(arguments), PARAMETERS[name])
    assert call_id is None or call_id.startswith("call_")


def streamed_calls(stream: Any) -> tuple[list[dict[str, str]], str | None, str]:
    """The calls a stream's chunks accumulate to (by index, as the SDKs do), its finish and its text."""
    calls: dict[int, dict[str, str]] = {}
    finish, text = None, ""
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for part in choice.delta.tool_calls or ():
                call = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
                if part.id:
                    assert not call["id"] and part.type == "function"  # the id comes once, on the first
                    call["id"] = part.id
                call["name"] += part.function.name or ""
                call["arguments"] += part.function.arguments or ""
            finish = choice.finish_reason or finish
    return [calls[i] for i in sorted(calls)], finish, text


@pytest.mark.parametrize("messages", [ASK, SUM], ids=["weather", "sum"])
@pytest.mark.parametrize("choice", ["required", NAMED_ADD], ids=["required", "named"])
def test_required_and_named_choices_give_valid_calls_unstreamed(
    sdk: openai.OpenAI, choice: Any, messages: Any
) -> None:
    got = create(sdk, messages=messages, tools=TOOLS, tool_choice=choice, temperature=0)
    message = got.choices[0].message
    assert got.choices[0].finish_reason == "tool_calls" and message.content is None
    assert message.tool_calls, message
    for call in message.tool_calls:
        assert call.type == "function"
        assert_valid_call(call.function.name, call.function.arguments, call.id)
    if choice == NAMED_ADD:
        assert [c.function.name for c in message.tool_calls] == ["add"]
    assert got.usage is not None and got.usage.completion_tokens > 0 and got.usage.prompt_tokens > 0


@pytest.mark.parametrize("choice", ["required", NAMED_ADD], ids=["required", "named"])
def test_required_and_named_choices_stream_calls_the_sdk_accumulates(sdk: openai.OpenAI, choice: Any) -> None:
    stream = create(sdk, messages=SUM, tools=TOOLS, tool_choice=choice, temperature=0, stream=True)
    calls, finish, text = streamed_calls(stream)
    assert finish == "tool_calls" and text == "" and calls
    for call in calls:
        assert_valid_call(call["name"], call["arguments"], call["id"])
    unstreamed = create(sdk, messages=SUM, tools=TOOLS, tool_choice=choice, temperature=0).choices[0].message
    assert [(c["name"], c["arguments"]) for c in calls] == [
        (c.function.name, c.function.arguments) for c in unstreamed.tool_calls
    ]  # greedy: the same calls


def test_sampled_choices_each_get_calls_of_their_own_with_logprobs(sdk: openai.OpenAI) -> None:
    got = create(
        sdk,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        n=3,
        temperature=1.0,
        seed=7,
        logprobs=True,
    )
    ids = []
    for choice in got.choices:
        assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1  # not parallel
        call = choice.message.tool_calls[0]
        assert_valid_call(call.function.name, call.function.arguments, call.id)
        ids.append(call.id)
        assert choice.logprobs is not None and choice.logprobs.content  # the reply's tokens, as for text
    assert len(set(ids)) == 3


def test_streamed_choices_each_get_calls_and_every_tokens_logprob(server: RunningServer) -> None:
    body = {
        "messages": ASK,
        "tools": TOOLS,
        "tool_choice": "required",
        "n": 2,
        "temperature": 1.0,
        "seed": 5,
        "logprobs": True,
        "max_tokens": MAX_NEW,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    connection = http.client.HTTPConnection("127.0.0.1", server.config.http_port, timeout=120)
    connection.request(
        "POST", "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    data = connection.getresponse().read().decode()
    chunks = [json.loads(line[6:]) for line in data.split("\n\n") if line.startswith("data: {")]
    calls: dict[int, dict[int, dict[str, str]]] = {}
    logprobs = 0
    for chunk in chunks:
        for choice in chunk["choices"]:
            logprobs += len((choice["logprobs"] or {}).get("content") or [])
            for part in choice["delta"].get("tool_calls", []):
                made = calls.setdefault(choice["index"], {})
                call = made.setdefault(part["index"], {"name": "", "arguments": ""})
                call["name"] += part["function"].get("name") or ""
                call["arguments"] += part["function"]["arguments"]
    assert sorted(calls) == [0, 1]
    for made in calls.values():
        for call in made.values():
            assert_valid_call(call["name"], call["arguments"], None)
    assert logprobs == chunks[-1]["usage"]["completion_tokens"]  # every token's, held ones too
    finishes = [c["finish_reason"] for chunk in chunks for c in chunk["choices"] if c["finish_reason"]]
    assert finishes == ["tool_calls", "tool_calls"]


class Weather(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=30)
    unit: str = pydantic.Field(pattern="^(celsius|fahrenheit)$")


class Order(pydantic.BaseModel):
    """An order of a few items: nested models, so the schema holds $defs and $refs."""

    class Item(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=20)
        quantity: int = pydantic.Field(ge=1, le=9)

    items: list[Item] = pydantic.Field(min_length=1, max_length=2)


@pytest.mark.parametrize("model", [Weather, Order])
def test_pydantic_function_tools_parse_back_into_their_models(
    sdk: openai.OpenAI, model: type[pydantic.BaseModel]
) -> None:
    tool = openai.pydantic_function_tool(model)
    name = tool["function"]["name"]
    named: Any = {"type": "function", "function": {"name": name}}
    # One call asked for: with parallel calls allowed, "required" lets the small model write the
    # same call again and again (onnxruntime 1.32's kernels tip it there) until max_tokens.
    for choice in (named, "required"):
        got = sdk.chat.completions.parse(
            model="",
            messages=ASK,
            tools=[tool],
            tool_choice=choice,
            parallel_tool_calls=False,
            temperature=0,
            max_tokens=200,
        )
        calls = got.choices[0].message.tool_calls
        assert calls is not None and calls[0].function.name == name
        assert isinstance(calls[0].function.parsed_arguments, model)
    with sdk.chat.completions.stream(
        model="", messages=ASK, tools=[tool], tool_choice=named, temperature=0, max_tokens=200
    ) as stream:
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert calls is not None and isinstance(calls[0].function.parsed_arguments, model)


def test_a_history_of_calls_and_results_reaches_the_prompt(server: RunningServer, sdk: openai.OpenAI) -> None:
    status, tokenized = post(server, "/tokenize", {"messages": HISTORY})
    assert status == 200
    status, detokenized = post(server, "/detokenize", {"tokens": tokenized["tokens"]})
    prompt = detokenized["prompt"]
    assert '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}' in prompt
    assert "<tool_response>\n18 degrees and sunny\n</tool_response>" in prompt
    _, without = post(server, "/tokenize", {"messages": HISTORY[:1]})
    assert tokenized["count"] > without["count"] + 20
    got = create(sdk, messages=HISTORY, tools=TOOLS, temperature=0, max_tokens=8)
    assert got.usage is not None and got.usage.prompt_tokens > tokenized["count"]  # and the tools' block


def test_the_tools_reach_the_prompt_as_the_default_block_on_a_template_without_tools(
    server: RunningServer, sdk: openai.OpenAI
) -> None:
    _, tokenized = post(server, "/tokenize", {"messages": ASK, "tools": TOOLS})
    _, detokenized = post(server, "/detokenize", {"tokens": tokenized["tokens"]})
    prompt = detokenized["prompt"]
    assert "You are provided with function signatures within <tools></tools> XML tags" in prompt
    assert '"name": "get_weather", "description": "The current weather in a city"' in prompt
    for choice in ("none", "auto", NAMED_ADD):
        got = create(sdk, messages=ASK, tools=TOOLS, tool_choice=choice, temperature=0, max_tokens=1)
        assert got.usage is not None and got.usage.prompt_tokens == tokenized["count"]


def hermes_text(calls: list[tuple[str, dict[str, Any]]], before: str = "") -> str:
    written = [f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>" for n, a in calls]
    return before + "\n".join(written)


FORCED = hermes_text(
    [("get_weather", {"city": "Paris", "unit": "celsius"}), ("add", {"a": 2, "b": 3})],
    before="Let me check both.\n",
)


def forced(text: str) -> dict[str, Any]:
    """A one-option constraint: the model writes exactly `text` (an auto reply whose text is known)."""
    return {"structured_outputs": {"choice": [text]}}


def test_auto_reads_the_models_own_call_format_from_its_reply(sdk: openai.OpenAI) -> None:
    got = create(sdk, messages=ASK, tools=TOOLS, temperature=0, extra_body=forced(FORCED))
    message = got.choices[0].message
    assert got.choices[0].finish_reason == "tool_calls" and message.content == "Let me check both."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("get_weather", {"city": "Paris", "unit": "celsius"}),
        ("add", {"a": 2, "b": 3}),
    ]
    assert len({c.id for c in message.tool_calls}) == 2
    plain = create(sdk, messages=ASK, tools=TOOLS, temperature=0, extra_body=forced("It is sunny."))
    assert plain.choices[0].message.content == "It is sunny." and not plain.choices[0].message.tool_calls
    assert plain.choices[0].finish_reason == "stop"


def test_auto_streams_text_then_the_calls_it_held_back(sdk: openai.OpenAI) -> None:
    stream = create(sdk, messages=ASK, tools=TOOLS, temperature=0, stream=True, extra_body=forced(FORCED))
    calls, finish, text = streamed_calls(stream)
    assert finish == "tool_calls" and text == "Let me check both."
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris", "unit": "celsius"}),
        ("add", {"a": 2, "b": 3}),
    ]
    stream = create(
        sdk,
        messages=ASK,
        tools=TOOLS,
        temperature=0,
        stream=True,
        extra_body=forced("See <tool_call> in the docs."),
    )  # not a call: all text
    calls, finish, text = streamed_calls(stream)
    assert (calls, finish, text) == ([], "stop", "See <tool_call> in the docs.")


def test_tool_choice_none_answers_in_text_even_when_the_reply_looks_like_a_call(sdk: openai.OpenAI) -> None:
    got = create(sdk, messages=ASK, tools=TOOLS, tool_choice="none", temperature=0, extra_body=forced(FORCED))
    assert got.choices[0].message.content == FORCED and not got.choices[0].message.tool_calls


BAD_FUNCTION = {"type": "function", "function": {"name": "has space"}}
TEXT_PARAMETERS = {"type": "function", "function": {"name": "f", "parameters": "{}"}}
NOT_SERVED = {
    "type": "function",
    "function": {
        "name": "f",
        "parameters": {  # a schema Ladder does not serve
            "type": "object",
            "properties": {"x": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
        },
    },
}
HUGE = {
    "type": "function",
    "function": {
        "name": "f",
        "parameters": {  # over the 1 MiB schema limit
            "type": "object",
            "properties": {"x": {"enum": [f"value {i:06d}" for i in range(80_000)]}},
        },
    },
}
REFUSED = [
    ({"tools": [BAD_FUNCTION]}, "tools[0].function.name"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": [TEXT_PARAMETERS]}, "tools[0].function.parameters"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, "tools[1].function.name"),
    ({"tools": {"get_weather": {}}}, "tools"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "launch"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"tools": [NOT_SERVED], "tool_choice": "required"}, "tools"),
    ({"tools": [HUGE], "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tools"),
    (
        {"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": 3}}]}]},
        "messages[0].tool_calls[0]",
    ),
    ({"functions": [{"name": "f"}]}, "functions"),
]


@pytest.mark.parametrize(("changes", "param"), REFUSED, ids=[p for _, p in REFUSED])
def test_bad_tools_are_refused_with_400_naming_the_field(
    server: RunningServer, changes: dict[str, Any], param: str
) -> None:
    status, body = post(server, "/v1/chat/completions", {"messages": ASK, "max_tokens": 4, **changes})
    assert status == 400, body
    assert body["error"]["param"] == param and body["error"]["type"] == "invalid_request_error", body


def test_tools_on_completions_are_refused(server: RunningServer) -> None:
    status, body = post(server, "/v1/completions", {"prompt": "Hi", "tools": TOOLS})
    assert status == 400 and body["error"]["param"] == "tools"


def test_a_server_set_to_llama3_json_reads_that_format(default_model: Callable[..., Path]) -> None:
    config = server_config(
        default_model("int4"),
        http_port=free_port(),
        max_sessions=2,
        capacity=1024,
        chunk_size=64,
        tool_call_format="llama3_json",
    )
    reply = '{"name": "add", "parameters": {"a": 2, "b": 3}}'
    with RunningServer(config) as running:
        status, body = post(
            running,
            "/v1/chat/completions",
            {"messages": SUM, "tools": TOOLS, "temperature": 0, "max_tokens": 40, **forced(reply)},
        )
        assert status == 200, body
        message = body["choices"][0]["message"]
        assert message["content"] is None and body["choices"][0]["finish_reason"] == "tool_calls"
        called = [
            (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]
        ]
        assert called == [("add", {"a": 2, "b": 3})]
        _, hermes = post(
            running,
            "/v1/chat/completions",
            {"messages": SUM, "tools": TOOLS, "temperature": 0, "max_tokens": MAX_NEW, **forced(FORCED)},
        )
        assert hermes["choices"][0]["message"]["content"] == FORCED  # not this server's format: text


# -- LangChain (when installed: pyproject's dev extra) -------------------------------------------------


class GetWeather(pydantic.BaseModel):
    """The current weather in a city."""

    city: str = pydantic.Field(max_length=30)


@pytest.fixture(scope="module")
def chat_model(server: RunningServer) -> Any:
    langchain_openai = pytest.importorskip("langchain_openai")
    return langchain_openai.ChatOpenAI(
        base_url=f"http://127.0.0.1:{server.config.http_port}/v1",
        api_key="none",
        model=Path(server.config.model).name,
        temperature=0,
        max_tokens=MAX_NEW,
        max_retries=0,
    )


@pytest.mark.parametrize("tool_choice", ["GetWeather", "any"])
def test_langchain_bind_tools_gets_tool_calls(chat_model: Any, tool_choice: str) -> None:
    bound = chat_model.bind_tools([GetWeather], tool_choice=tool_choice)
    reply = bound.invoke("What is the weather in Paris?")
    assert [c["name"] for c in reply.tool_calls] == ["GetWeather"]
    GetWeather.model_validate(reply.tool_calls[0]["args"])
    chunks = list(bound.stream("What is the weather in Rome?"))
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole = whole + chunk
    assert [c["name"] for c in whole.tool_calls] == ["GetWeather"]
    GetWeather.model_validate(whole.tool_calls[0]["args"])


def test_langchain_structured_output_by_function_calling(chat_model: Any) -> None:
    structured = chat_model.with_structured_output(GetWeather, method="function_calling")
    assert isinstance(structured.invoke("What is the weather in Oslo?"), GetWeather)


# -- gRPC: the same tools on GenerateRequest ------------------------------------------------------------


def grpc_tools() -> list[Any]:
    return [
        pb.Tool(
            name=t["function"]["name"],
            description=t["function"]["description"],
            parameters=json.dumps(t["function"]["parameters"]),
        )
        for t in TOOLS
    ]


def grpc_request(
    choice: pb.ToolChoice, text: str = SUM[0]["content"], n: int = 1, **changes: Any
) -> pb.GenerateRequest:
    chat = pb.Chat(messages=[pb.ChatMessage(role="user", content=text)], tools=grpc_tools())
    return pb.GenerateRequest(
        prompt=pb.Prompt(chat=chat),
        tool_choice=choice,
        n=n,
        stopping=pb.StoppingOptions(max_new_tokens=MAX_NEW),
        **changes,
    )


MODE = pb.ToolChoice


def grpc_chat(tools: list[pb.Tool]) -> pb.GenerateRequest:
    chat = pb.Chat(messages=[pb.ChatMessage(role="user", content="Hi")], tools=tools)
    return pb.GenerateRequest(prompt=pb.Prompt(chat=chat))


@pytest.mark.parametrize(
    "choice",
    [MODE(mode=MODE.MODE_REQUIRED), MODE(mode=MODE.MODE_FUNCTION, function="add")],
    ids=["required", "function"],
)
def test_grpc_generate_reads_constrained_calls_into_the_completion(
    server: RunningServer, choice: pb.ToolChoice
) -> None:
    sampled = pb.SamplingOptions(temperature=1.0, seed=3)
    reply = server.stub.Generate(grpc_request(choice, n=2, sampling=sampled))
    for sample in reply.samples:
        assert sample.tool_calls and sample.content == ""
        for call in sample.tool_calls:
            assert_valid_call(call.name, call.arguments, call.id)
    assert list(reply.tool_calls) == list(reply.samples[0].tool_calls)
    events = list(server.stub.GenerateStream(grpc_request(choice)))
    done = events[-1].done
    assert "".join(e.token.text for e in events[:-1]) == done.text  # the reply streams as tokens
    assert done.tool_calls and all(c.id.startswith("call_") for c in done.tool_calls)


def test_grpc_auto_reads_the_models_format_and_history_reaches_the_prompt(server: RunningServer) -> None:
    forced_reply = pb.Constraint(choice=pb.Choices(options=[FORCED]))
    reply = server.stub.Generate(grpc_request(MODE(), constraint=forced_reply))  # unset mode: auto
    assert reply.content == "Let me check both." and reply.text == FORCED
    assert [(c.name, json.loads(c.arguments)) for c in reply.tool_calls] == [
        ("get_weather", {"city": "Paris", "unit": "celsius"}),
        ("add", {"a": 2, "b": 3}),
    ]
    history = pb.Chat(
        messages=[
            pb.ChatMessage(role="user", content=ASK[0]["content"]),
            pb.ChatMessage(
                role="assistant",
                tool_calls=[pb.ToolCall(id="call_abc", name="get_weather", arguments='{"city": "Paris"}')],
            ),
            pb.ChatMessage(role="tool", tool_call_id="call_abc", content="18 degrees and sunny"),
        ]
    )
    ids = server.stub.Tokenize(pb.TokenizeRequest(chat=history)).ids
    prompt = server.stub.Detokenize(pb.DetokenizeRequest(ids=ids)).text
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt and "18 degrees" in prompt


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (grpc_request(MODE(mode=MODE.MODE_FUNCTION, function="launch")), "tool_choice.function"),
        (
            pb.GenerateRequest(prompt=pb.Prompt(text="Hi"), tool_choice=MODE(mode=MODE.MODE_REQUIRED)),
            "tool_choice",
        ),
        (grpc_request(MODE(mode=MODE.MODE_REQUIRED), constraint=pb.Constraint(regex="a")), "tool_choice"),
        (grpc_chat([pb.Tool(name="bad name")]), "prompt.chat.tools[0].name"),
        (grpc_chat([pb.Tool(name="f"), pb.Tool(name="f")]), "prompt.chat.tools[1].name"),
        (grpc_chat([pb.Tool(name="f", parameters="[]")]), "prompt.chat.tools[0].parameters"),
    ],
    ids=["unknown-function", "no-tools", "beside-constraint", "bad-name", "twice", "bad-parameters"],
)
def test_grpc_bad_tools_are_invalid_argument_naming_the_field(
    server: RunningServer, request_: pb.GenerateRequest, field: str
) -> None:
    details = details_of(lambda: server.stub.Generate(request_))
    assert details.code == grpc.StatusCode.INVALID_ARGUMENT and details.reason == "INVALID_TOOLS"
    assert details.fields == [field]


# -- instructor (pyproject's dev extra: instructor 1.17 caps jiter <0.15, which holds openai at 3.3.0) ----


class Forecast(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=30)
    unit: str = pydantic.Field(pattern="^(celsius|fahrenheit)$")


class Sum(pydantic.BaseModel):
    a: int = pydantic.Field(ge=0, le=1000)
    b: int = pydantic.Field(ge=0, le=1000)


@pytest.fixture(scope="module")
def instructor_module() -> Any:
    return pytest.importorskip("instructor")


# TOOLS names the model's one tool in tool_choice (constrained); `strict` puts strict: true on it.
# TOOLS_STRICT is the older spelling of TOOLS with strict=True (deprecated since instructor 1.15).
@pytest.mark.filterwarnings("ignore:Mode.TOOLS_STRICT is deprecated:DeprecationWarning")
@pytest.mark.parametrize(
    ("mode", "strict"),
    [("TOOLS", False), ("TOOLS", True), ("TOOLS_STRICT", True)],
    ids=["TOOLS", "TOOLS-strict", "TOOLS_STRICT"],
)
def test_instructor_tool_modes_fill_their_model(
    instructor_module: Any, sdk: openai.OpenAI, mode: str, strict: bool
) -> None:
    client = instructor_module.from_openai(sdk, mode=getattr(instructor_module.Mode, mode))
    asked: dict[str, Any] = {
        "model": "",
        "response_model": Forecast,
        "messages": ASK,
        "max_retries": 0,
        "max_tokens": MAX_NEW,
        "temperature": 0,
        "strict": strict,
    }
    got = client.chat.completions.create(**asked)
    assert isinstance(got, Forecast)
    completion = got._raw_response  # what the server answered: one call of the named tool
    assert completion.choices[0].finish_reason == "tool_calls"
    assert [c.function.name for c in completion.choices[0].message.tool_calls] == ["Forecast"]
    partials = list(client.chat.completions.create_partial(**asked))  # streamed: delta.tool_calls
    assert len(partials) > 1 and partials[-1].model_dump() == got.model_dump()  # greedy: the same call


def test_instructor_parallel_tools_reads_every_call_of_an_auto_reply(
    instructor_module: Any, sdk: openai.OpenAI
) -> None:
    """PARALLEL_TOOLS asks tool_choice "auto", which the default model (135M parameters) answers in text:
    its reply is scripted here with a one-option constraint (as the auto tests above), so it is the
    model's own call format, read back by the server into calls of both tools, which instructor
    turns into one model per call, in order."""
    client = instructor_module.from_openai(sdk, mode=instructor_module.Mode.PARALLEL_TOOLS)
    calls = [
        ("Forecast", {"city": "Paris", "unit": "celsius"}),
        ("Sum", {"a": 12, "b": 30}),
        ("Forecast", {"city": "Rome", "unit": "fahrenheit"}),
    ]
    got = list(
        client.chat.completions.create(
            model="",
            response_model=Iterable[Forecast | Sum],
            messages=ASK,
            max_retries=0,
            max_tokens=256,
            temperature=0,
            extra_body=forced(hermes_text(calls, before="Checking.\n")),
        )
    )
    assert [(type(m).__name__, m.model_dump()) for m in got] == [(n, a) for n, a in calls]
