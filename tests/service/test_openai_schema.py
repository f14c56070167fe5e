"""Every response shape of the OpenAI-compatible API validates against OpenAI's published OpenAPI spec.

The spec's response schemas are vendored in tests/service/openai_openapi/ (schemas.json: the schemas
these tests use and every one they reference, from openai/openai-openapi's openapi.json at the commit
it names; scripts/vendor_openai_schemas.py makes it). The spec is OpenAPI 3.1 but still writes
`nullable: true` in places (3.0's keyword): read as JSON Schema's null type, as it means.

Two places where the spec is stricter than OpenAI's own API and every client reads it, each allowed
explicitly below and nowhere else: a completions stream's chunks before a choice's last carry
`finish_reason: null` (the spec gives streamed and whole completions one shape, whose finish_reason is
a string; OpenAI's own streams send null until the last chunk), and an echoed prompt's first token
has a null log-probability (nothing predicts it; OpenAI and vLLM return null there, the spec says
number).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.service.test_openai_http import events, http_server, post
from tests.support.servers import RunningServer

SPEC = Path(__file__).with_name("openai_openapi") / "schemas.json"
CHAT, CHUNK, COMPLETION = (
    "CreateChatCompletionResponse",
    "CreateChatCompletionStreamResponse",
    "CreateCompletionResponse",
)
MESSAGES = [{"role": "user", "content": "hi"}]
# Short calls whatever the generated model's weights (an open number may run past max_tokens).
PICK = {
    "type": "function",
    "function": {
        "name": "pick",
        "description": "Pick a colour",
        "parameters": {
            "type": "object",
            "properties": {"colour": {"enum": ["red", "green"]}},
            "required": ["colour"],
            "additionalProperties": False,
        },
    },
}


def nullable_as_null(node: Any) -> Any:
    """The spec with OpenAPI 3.0's `nullable: true` written as JSON Schema's null type."""
    if isinstance(node, list):
        return [nullable_as_null(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: nullable_as_null(value) for key, value in node.items() if key != "nullable"}
    if node.get("nullable") is True:
        return {"anyOf": [out, {"type": "null"}]}
    return out


def load_spec() -> dict[str, Any]:
    spec: dict[str, Any] = json.loads(SPEC.read_text())
    return {"components": nullable_as_null(spec["components"])}


def validator(spec: dict[str, Any], name: str) -> jsonschema.protocols.Validator:
    schema = {**spec, "$ref": f"#/components/schemas/{name}"}
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def completion_choice(spec: dict[str, Any]) -> dict[str, Any]:
    choice: dict[str, Any] = spec["components"]["schemas"][COMPLETION]["properties"]["choices"]["items"]
    return choice


def null_finish(spec: dict[str, Any]) -> dict[str, Any]:
    """Allowed explicitly: finish_reason null on a completions chunk that is not its choice's last."""
    reason = completion_choice(spec)["properties"]["finish_reason"]
    completion_choice(spec)["properties"]["finish_reason"] = {"anyOf": [reason, {"type": "null"}]}
    return spec


def null_first_logprob(spec: dict[str, Any]) -> dict[str, Any]:
    """Allowed explicitly: an echoed prompt's first token has null for its log-probability and for its
    alternatives."""
    found = completion_choice(spec)["properties"]["logprobs"]["anyOf"][0]["properties"]
    for key in ("token_logprobs", "top_logprobs"):
        found[key]["items"] = {"anyOf": [found[key]["items"], {"type": "null"}]}
    return spec


@pytest.fixture(scope="module")
def server(served_model: Path) -> Iterator[RunningServer]:
    with http_server(served_model) as running:
        yield running


def answer(server: RunningServer, path: str, body: dict[str, Any]) -> Any:
    response, data = post(server, path, body)
    assert response.status == 200, data
    if not body.get("stream"):
        return json.loads(data)
    found = events(data)
    assert found[-1] == "[DONE]"
    return [json.loads(d) for d in found[:-1]]


def assert_valid(check: jsonschema.protocols.Validator, instance: Any) -> None:
    errors = sorted(check.iter_errors(instance), key=lambda e: list(e.absolute_path))
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors[:5]]


ONE_CALL = {"max_tokens": 100, "temperature": 0, "parallel_tool_calls": False, "tools": [PICK]}
CHAT_BODIES: dict[str, dict[str, Any]] = {
    "plain": {"max_tokens": 4},
    "n and logprobs": {"max_tokens": 4, "n": 2, "seed": 1, "logprobs": True, "top_logprobs": 2},
    "json schema": {
        "max_tokens": 12,
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": "x",
                "schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
            },
        },
    },
    "a named tool": {**ONE_CALL, "tool_choice": {"type": "function", "function": {"name": "pick"}}},
    "a required tool, logprobs": {**ONE_CALL, "tool_choice": "required", "logprobs": True},
    "tools offered, none called": {"max_tokens": 4, "tools": [PICK], "tool_choice": "none"},
}


@pytest.mark.parametrize("shape", list(CHAT_BODIES))
def test_a_chat_completion_and_its_chunks_validate_against_openai_s_spec(
    server: RunningServer, shape: str
) -> None:
    spec = load_spec()
    body = {"messages": MESSAGES, **CHAT_BODIES[shape]}
    whole = answer(server, "/v1/chat/completions", body)
    assert_valid(validator(spec, CHAT), whole)
    if "tool" in shape and shape != "tools offered, none called":
        assert whole["choices"][0]["message"]["tool_calls"], whole
    chunks = answer(
        server, "/v1/chat/completions", {**body, "stream": True, "stream_options": {"include_usage": True}}
    )
    check = validator(spec, CHUNK)
    for chunk in chunks:
        assert_valid(check, chunk)
    assert chunks[-1]["usage"] == whole["usage"] or "seed" not in body


COMPLETION_BODIES: dict[str, dict[str, Any]] = {
    "plain": {"prompt": "The quick brown fox", "max_tokens": 4},
    "several prompts, n, logprobs": {
        "prompt": ["The quick", [65, 66, 67]],
        "n": 2,
        "max_tokens": 4,
        "logprobs": 2,
        "seed": 3,
    },
    "a stop string, min_tokens": {"prompt": "The quick", "max_tokens": 6, "stop": ["e"], "min_tokens": 2},
    "echo": {"prompt": "The quick", "max_tokens": 3, "echo": True},
}


@pytest.mark.parametrize("shape", list(COMPLETION_BODIES))
def test_a_completion_and_its_chunks_validate_against_openai_s_spec(
    server: RunningServer, shape: str
) -> None:
    spec = load_spec()
    body = COMPLETION_BODIES[shape]
    assert_valid(validator(spec, COMPLETION), answer(server, "/v1/completions", body))
    chunks = answer(
        server, "/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}}
    )
    last = {choice["index"]: i for i, chunk in enumerate(chunks) for choice in chunk["choices"]}
    strict, streaming = validator(spec, COMPLETION), validator(null_finish(load_spec()), COMPLETION)
    for i, chunk in enumerate(chunks):
        final = all(last[choice["index"]] == i for choice in chunk["choices"])
        assert_valid(strict if final else streaming, chunk)
    prompts = len(body["prompt"]) if isinstance(body["prompt"], list) else 1
    assert sorted(last) == list(range(prompts * body.get("n", 1)))


def test_an_echo_with_logprobs_differs_from_the_spec_only_by_its_first_null(server: RunningServer) -> None:
    body = {"prompt": "The quick", "max_tokens": 1, "logprobs": 1, "echo": True}
    whole = answer(server, "/v1/completions", body)
    assert list(validator(load_spec(), COMPLETION).iter_errors(whole)), "the spec says number, not null"
    echoing = validator(null_first_logprob(load_spec()), COMPLETION)
    assert_valid(echoing, whole)
    first = copy.deepcopy(whole)
    for key in ("token_logprobs", "top_logprobs"):
        first["choices"][0]["logprobs"][key] = first["choices"][0]["logprobs"][key][1:]
    assert_valid(validator(load_spec(), COMPLETION), first)
    streaming = validator(null_finish(null_first_logprob(load_spec())), COMPLETION)
    for chunk in answer(server, "/v1/completions", {**body, "stream": True}):
        assert_valid(echoing if chunk["choices"][0]["finish_reason"] else streaming, chunk)
