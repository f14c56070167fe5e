"""The OpenAI-compatible HTTP API through a real server: the official `openai` SDK, and raw HTTP for SSE.

Each answer is held to what gRPC answers for the same request (the same typed call underneath),
each refusal to OpenAI's error object with the status the one error table gives.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from proto.ladder.v1 import ladder_pb2 as pb
from service.calls import ConstraintSpec
from service.http.openai import constraint
from tests.support.prompts import greedy_request, prompt_ids
from tests.support.servers import (
    FRONTENDS,
    FRONTENDS_IDS,
    RunningServer,
    both_ways,
    free_port,
    server_config,
)
from tests.support.waiting import wait_for

PROMPT = "The quick brown fox"
GREEDY = {"temperature": 0.0, "max_tokens": 12, "extra_body": {"ignore_eos": True}}
SCHEMA = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green", "blue"]}},
    "required": ["color"],
    "additionalProperties": False,
}


def http_server(model: Path, **changes: Any) -> RunningServer:
    return RunningServer(server_config(model, http_port=free_port(), **changes))


def client(running: RunningServer, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"http://127.0.0.1:{running.config.http_port}/v1", api_key=key, max_retries=0, timeout=30
    )


def post(
    running: RunningServer, path: str, body: dict[str, Any] | bytes, headers: dict[str, str] | None = None
) -> tuple[http.client.HTTPResponse, bytes]:
    """A raw POST: the response (its headers) and its whole body."""
    connection = http.client.HTTPConnection("127.0.0.1", running.config.http_port, timeout=30)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    connection.request("POST", path, data, {"Content-Type": "application/json", **(headers or {})})
    response = connection.getresponse()
    return response, response.read()


def events(body: bytes) -> list[str]:
    """The data of each server-sent event; every event is `data: ...` ended by a blank line."""
    text = body.decode()
    assert text.endswith("\n\n")
    blocks = text[:-2].split("\n\n")
    assert all(b.startswith("data: ") and "\n" not in b for b in blocks), blocks
    return [b.removeprefix("data: ") for b in blocks]


@pytest.fixture(scope="module", params=FRONTENDS, ids=FRONTENDS_IDS)
def server(served_model: Path, request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    """The HTTP API in the server's process, and in two frontend processes sharing its port."""
    with http_server(served_model, frontends=request.param) as running:
        yield running


@pytest.fixture(scope="module")
def sdk(server: RunningServer) -> openai.OpenAI:
    return client(server)


@pytest.fixture(scope="module")
def model(sdk: openai.OpenAI) -> str:
    return sdk.models.list().data[0].id


def test_the_models_list_names_the_one_model_served_and_gets_it_by_name(
    sdk: openai.OpenAI, server: RunningServer
) -> None:
    listed = sdk.models.list().data
    directory = server.server.serving.model.name  # type: ignore[union-attr]
    assert [m.id for m in listed] == [Path(directory).name]  # the directory's name, not its path
    assert sdk.models.retrieve(listed[0].id).id == listed[0].id
    assert sdk.models.retrieve(directory).id == listed[0].id  # the path names it too


def test_a_body_that_names_no_model_or_its_directory_gets_the_one_served(server: RunningServer) -> None:
    directory = server.server.serving.model.name  # type: ignore[union-attr]
    for named in ({}, {"model": directory}):
        response, data = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, **named})
        assert response.status == 200, data
        assert json.loads(data)["model"] == Path(directory).name
    response, data = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "model": "gpt-4"})
    assert response.status == 404 and json.loads(data)["error"]["code"] == "model_not_found"


def test_a_greedy_completion_is_the_grpc_generate_of_the_same_prompt(
    sdk: openai.OpenAI, model: str, server: RunningServer
) -> None:
    got = sdk.completions.create(model=model, prompt=PROMPT, **GREEDY)  # type: ignore[arg-type]
    grpc = server.stub.Generate(
        pb.GenerateRequest(
            prompt=pb.Prompt(text=PROMPT), stopping=pb.StoppingOptions(max_new_tokens=12, ignore_eos=True)
        )
    )
    assert got.choices[0].text == grpc.text and got.choices[0].finish_reason == "length"
    assert got.usage is not None and got.usage.completion_tokens == 12
    assert got.usage.prompt_tokens == grpc.usage.prompt_tokens


def test_a_chat_completion_goes_through_the_chat_template_as_a_grpc_chat_prompt_does(
    sdk: openai.OpenAI, model: str, server: RunningServer
) -> None:
    got = sdk.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], **GREEDY)  # type: ignore[arg-type]
    chat = pb.Chat(messages=[pb.ChatMessage(role="user", content="hi")])
    grpc = server.stub.Generate(
        pb.GenerateRequest(
            prompt=pb.Prompt(chat=chat), stopping=pb.StoppingOptions(max_new_tokens=12, ignore_eos=True)
        )
    )
    assert got.choices[0].message.role == "assistant"
    assert got.choices[0].message.content == grpc.text
    assert got.usage is not None and got.usage.prompt_tokens == grpc.usage.prompt_tokens


def test_streamed_chunks_join_to_the_unstreamed_text_of_every_one_of_n_choices(
    sdk: openai.OpenAI, model: str
) -> None:
    asked = {
        "model": model,
        "messages": [{"role": "user", "content": "tell me"}],
        "n": 3,
        "seed": 5,
        "temperature": 1.0,
        "max_tokens": 10,
    }
    whole = sdk.chat.completions.create(**asked)  # type: ignore[call-overload]
    texts, finishes = ["", "", ""], [None, None, None]
    stream = sdk.chat.completions.create(
        **asked,
        stream=True,  # type: ignore[call-overload]
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    for chunk in chunks[:-1]:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            finishes[choice.index] = choice.finish_reason or finishes[choice.index]
    assert sorted(c.index for c in whole.choices) == [0, 1, 2]
    assert texts == [c.message.content for c in whole.choices]
    assert finishes == [c.finish_reason for c in whole.choices]
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_a_seed_gives_the_same_sampled_text_every_time(sdk: openai.OpenAI, model: str) -> None:
    texts = {
        sdk.completions.create(model=model, prompt=PROMPT, temperature=1.0, top_p=0.9, seed=42, max_tokens=16)
        .choices[0]
        .text
        for _ in range(3)
    }
    assert len(texts) == 1


def test_a_stop_string_ends_the_text_before_it_or_after_it_when_asked(sdk: openai.OpenAI, model: str) -> None:
    free = sdk.completions.create(model=model, prompt=PROMPT, **GREEDY).choices[0].text  # type: ignore[arg-type]
    stop = free[5:7]
    got = sdk.completions.create(model=model, prompt=PROMPT, stop=[stop], **GREEDY)  # type: ignore[arg-type]
    assert got.choices[0].text == free[: free.index(stop)] and got.choices[0].finish_reason == "stop"
    including = {**GREEDY, "extra_body": {**GREEDY.get("extra_body", {}), "include_stop_str_in_output": True}}
    kept = sdk.completions.create(model=model, prompt=PROMPT, stop=[stop], **including)  # type: ignore[arg-type]
    assert kept.choices[0].text == free[: free.index(stop) + len(stop)]
    streamed = "".join(
        c.choices[0].text
        for c in sdk.completions.create(model=model, prompt=PROMPT, stop=[stop], stream=True, **including)
        if c.choices
    )  # type: ignore[arg-type]
    assert streamed == kept.choices[0].text


def test_chat_logprobs_name_each_token_with_its_top_alternatives_most_likely_first(
    sdk: openai.OpenAI, model: str
) -> None:
    got = sdk.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], logprobs=True, top_logprobs=3, **GREEDY
    )  # type: ignore[arg-type]
    content = got.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 12
    for token in content:
        assert len(token.top_logprobs) == 3
        assert token.logprob == token.top_logprobs[0].logprob  # greedy: the chosen token is the likeliest
        assert [t.logprob for t in token.top_logprobs] == sorted(
            (t.logprob for t in token.top_logprobs), reverse=True
        )


def test_completion_logprobs_cover_every_token_with_offsets_into_the_text(
    sdk: openai.OpenAI, model: str
) -> None:
    got = sdk.completions.create(model=model, prompt=PROMPT, logprobs=2, **GREEDY)  # type: ignore[arg-type]
    found = got.choices[0].logprobs
    assert found is not None and found.tokens is not None and found.top_logprobs is not None
    assert len(found.tokens) == len(found.token_logprobs or []) == len(found.top_logprobs) == 12
    assert all(len(top) <= 2 for top in found.top_logprobs)
    # Where each token's text starts (exactly: tests/service/test_openai_completions.py); a token that
    # only begins a character adds nothing, though its own text is U+FFFD.
    assert found.text_offset is not None and found.text_offset[0] == 0
    assert found.text_offset == sorted(found.text_offset) and found.text_offset[-1] < len(got.choices[0].text)


def test_a_json_schema_response_format_gives_json_the_schema_accepts(sdk: openai.OpenAI, model: str) -> None:
    got = sdk.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "a color"}],
        max_tokens=40,
        n=2,
        seed=3,
        response_format={"type": "json_schema", "json_schema": {"name": "color", "schema": SCHEMA}},
    )
    for choice in got.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content or ""), SCHEMA)


def test_a_strict_json_schema_response_format_is_read_strictly_and_strict_takes_a_boolean(
    sdk: openai.OpenAI, model: str
) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    got = sdk.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "ok?"}],
        max_tokens=40,
        seed=3,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "ok", "schema": schema, "strict": True},
        },
    )
    assert got.choices[0].finish_reason == "stop"
    assert json.loads(got.choices[0].message.content or "").keys() == {"ok"}  # no other member, strictly
    with pytest.raises(openai.BadRequestError) as raised:
        sdk.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "ok?"}],
            max_tokens=4,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "ok", "schema": schema, "strict": "yes"},
            },
        )  # type: ignore[typeddict-item]
    body = raised.value.body
    assert isinstance(body, dict) and body["param"] == "response_format.json_schema.strict"


def test_a_bad_value_is_400_with_the_error_object_naming_the_parameter(
    sdk: openai.OpenAI, model: str
) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        sdk.completions.create(model=model, prompt=PROMPT, temperature=-1.0)
    error = raised.value.body
    assert raised.value.status_code == 400
    assert isinstance(error, dict) and error["param"] == "temperature" and error["code"] == "invalid_sampling"
    assert error["type"] == "invalid_request_error" and "temperature" in error["message"]


def test_an_unknown_model_is_404_model_not_found(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as raised:
        sdk.completions.create(model="gpt-4", prompt=PROMPT)
    assert isinstance(raised.value.body, dict) and raised.value.body["code"] == "model_not_found"


def test_a_body_over_the_message_limit_is_413(server: RunningServer, model: str) -> None:
    response, body = post(server, "/v1/completions", {"model": model, "prompt": "x" * (5 << 20)})
    assert response.status == 413 and json.loads(body)["error"]["code"] == "message_too_large"


def test_a_stream_is_data_events_then_done_with_usage_last_when_asked(
    server: RunningServer, model: str
) -> None:
    response, body = post(
        server,
        "/v1/completions",
        {
            "model": model,
            "prompt": PROMPT,
            "max_tokens": 5,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert response.status == 200 and response.getheader("Content-Type", "").startswith("text/event-stream")
    data = events(body)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["object"] == "text_completion" and len({c["id"] for c in chunks}) == 1 for c in chunks)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 2) + ["length"]


def test_http_calls_are_counted_with_the_http_protocol_label(server: RunningServer, model: str) -> None:
    post(server, "/v1/completions", {"model": model, "prompt": PROMPT, "max_tokens": 2})
    labels = {"protocol": "http", "method": "/v1/completions", "code": "OK"}
    assert (server.server.metrics.registry.get_sample_value("ladder_calls_total", labels) or 0) >= 1


def test_a_missing_or_unknown_token_is_401_and_a_known_one_is_served(served_model: Path) -> None:
    with http_server(served_model, auth_tokens=("alice=secret",)) as running:
        name = client(running, "secret").models.list().data[0].id
        with pytest.raises(openai.AuthenticationError) as unknown:
            client(running, "guess").completions.create(model=name, prompt=PROMPT, max_tokens=2)
        missing, body = post(running, "/v1/completions", {"model": name, "prompt": PROMPT})
    assert unknown.value.status_code == 401 and isinstance(unknown.value.body, dict)
    assert unknown.value.body["code"] == "token_unknown"
    assert unknown.value.body["type"] == "authentication_error"
    assert missing.status == 401 and json.loads(body)["error"]["code"] == "token_missing"


def test_a_full_queue_is_429_with_retry_after(served_model: Path) -> None:
    with http_server(served_model, max_sessions=1, max_queue=1) as running:
        name = client(running).models.list().data[0].id
        with running.frozen() as scheduler:
            stream = running.stub.GenerateStream(greedy_request(prompt_ids(20), 200))
            wait_for(lambda: scheduler.depth == 1)
            response, body = post(running, "/v1/completions", {"model": name, "prompt": PROMPT})
            with pytest.raises(openai.RateLimitError) as raised:
                client(running).completions.create(model=name, prompt=PROMPT, max_tokens=2)
        stream.cancel()
    assert response.status == 429 and response.getheader("Retry-After") == "1"
    assert json.loads(body)["error"]["code"] == "queue_full"
    assert raised.value.response.headers["retry-after"] == "1"


@both_ways
def test_a_draining_server_is_503_with_retry_after_and_its_health_says_so(
    served_model: Path, frontends: int
) -> None:
    with http_server(served_model, frontends=frontends) as running:
        name = client(running).models.list().data[0].id

        def health() -> int:
            connection = http.client.HTTPConnection("127.0.0.1", running.config.http_port, timeout=10)
            connection.request("GET", "/health")
            return connection.getresponse().status

        with running.frozen() as scheduler:
            stream = running.stub.GenerateStream(greedy_request(prompt_ids(20), 200))
            wait_for(lambda: scheduler.depth == 1)
            draining = asyncio.run_coroutine_threadsafe(running.server.drain(grace=20), running.loop)
            # Every process serving HTTP has heard of the drain (fresh connections reach either).
            wait_for(lambda: all(health() == 503 for _ in range(4)))
            response, body = post(running, "/v1/completions", {"model": name, "prompt": PROMPT})
            stream.cancel()
        draining.result(timeout=30)
    assert response.status == 503 and response.getheader("Retry-After") == "1"
    assert json.loads(body)["error"]["code"] == "draining"


def test_a_chat_answer_carries_refusal_null_on_its_message_and_its_logprobs(
    server: RunningServer, model: str
) -> None:
    """OpenAI's schema requires `refusal` (nullable) on a chat message and on its logprobs."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 3,
        "logprobs": True,
        "top_logprobs": 1,
    }
    response, answer = post(server, "/v1/chat/completions", body)
    assert response.status == 200
    choice = json.loads(answer)["choices"][0]
    assert choice["message"]["refusal"] is None and "refusal" in choice["message"]
    assert choice["logprobs"]["refusal"] is None and len(choice["logprobs"]["content"]) == 3


def test_tokenize_and_detokenize_answer_as_the_grpc_calls_in_vllm_s_shapes(
    server: RunningServer, model: str
) -> None:
    text = "The capital of France is"
    ids = list(server.stub.Tokenize(pb.TokenizeRequest(text=text)).ids)
    response, body = post(server, "/tokenize", {"model": model, "prompt": text})
    assert response.status == 200
    answer = json.loads(body)
    assert answer["tokens"] == ids and answer["count"] == len(ids) and answer["max_model_len"] > 0
    response, body = post(server, "/detokenize", {"model": model, "tokens": ids})
    assert response.status == 200 and json.loads(body) == {"prompt": text}
    messages = [{"role": "user", "content": "Hi"}]
    chat = json.loads(post(server, "/tokenize", {"messages": messages})[1])
    grpc_chat = server.stub.Tokenize(
        pb.TokenizeRequest(chat=pb.Chat(messages=[pb.ChatMessage(role="user", content="Hi")]))
    )
    assert chat["tokens"] == list(grpc_chat.ids)
    refused = (
        ("/tokenize", {"prompt": 3}, "prompt"),
        ("/detokenize", {"tokens": ["a"]}, "tokens"),
        ("/detokenize", {"tokens": [10**9]}, "tokens"),
    )
    for path, bad, field in refused:
        response, body = post(server, path, bad)
        assert response.status == 400 and json.loads(body)["error"]["param"] == field, (path, body)


def test_logprob_bytes_are_each_token_s_own_so_they_join_to_the_reply_s_text(
    server: RunningServer, model: str
) -> None:
    """A token that is a piece of a multi-byte character has U+FFFD for its own text, and its real
    bytes in `bytes` (they were the replacement character's)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "请用中文回答：你好吗？"}],
        "max_tokens": 12,
        "logprobs": True,
        "temperature": 0,
    }
    response, answer = post(server, "/v1/chat/completions", body)
    assert response.status == 200
    choice = json.loads(answer)["choices"][0]
    content = choice["logprobs"]["content"]
    joined = b"".join(bytes(entry["bytes"]) for entry in content)
    assert joined.decode("utf-8", errors="replace").startswith(choice["message"]["content"])
    assert any(entry["token"] == "\ufffd" for entry in content), "the reply has a piece of a character"
    assert all(entry["bytes"] != list("\ufffd".encode()) for entry in content)


def _constraint(body: dict[str, Any]) -> ConstraintSpec:
    found = constraint(body)
    assert found is not None
    return found


def test_vllm_s_schema_fields_are_read_strictly_as_its_default_backend_reads_them() -> None:
    """xgrammar (vLLM's default) writes no undeclared member; response_format leaves it to the
    request's `strict` (else --json-schema-strict)."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    assert _constraint({"structured_outputs": {"json": schema}}).strict is True
    assert _constraint({"guided_json": schema}).strict is True
    assert _constraint({"guided_json": json.dumps(schema)}).strict is True
    assert _constraint({"guided_regex": "a+"}).strict is None
    named = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    assert _constraint({"response_format": named}).strict is None
    named["json_schema"]["strict"] = False
    assert _constraint({"response_format": named}).strict is False


def test_vllm_s_structured_outputs_field_constrains_as_its_guided_extras_do(
    server: RunningServer, model: str
) -> None:
    def text_of(extra: dict[str, Any]) -> str:
        body = {"model": model, "prompt": "The answer is", "max_tokens": 12, "temperature": 0, **extra}
        response, answer = post(server, "/v1/completions", body)
        assert response.status == 200, answer
        return str(json.loads(answer)["choices"][0]["text"])

    assert text_of({"structured_outputs": {"choice": ["yes", "no"]}}) in ("yes", "no")
    assert re.fullmatch(r"[0-9]{3}", text_of({"structured_outputs": {"regex": "[0-9]{3}"}}))
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    parsed = json.loads(text_of({"structured_outputs": {"json": schema}, "max_tokens": 40}))
    assert isinstance(parsed["n"], int) and set(parsed) == {"n"}
    assert text_of({"structured_outputs": {"choice": ["a", "b"]}}) == text_of({"guided_choice": ["a", "b"]})
    refused = (
        ({"structured_outputs": {"structural_tag": "x"}}, "structured_outputs.structural_tag"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "a"}, "guided_regex": "a"}, "structured_outputs"),
    )
    for extra, param in refused:
        response, answer = post(server, "/v1/completions", {"model": model, "prompt": "x", **extra})
        assert response.status == 400 and json.loads(answer)["error"]["param"] == param, answer
