"""The official openai npm package calls tools on /v1/chat/completions of a real server on the default
model (tests/service/test_tool_calls.py's server and tools; the Python SDK's twin of these tests is
there): tool_choice required and named, streamed and not, give calls of declared tools whose
arguments parse as JSON and validate against the tool's parameters, every choice finishing with
"tool_calls", and a stream's deltas (accumulated by hand, and by the SDK's own
chat.completions.stream) come to the unstreamed answer's calls.

The package (its version pinned in tests/clients/node_openai/package-lock.json) is installed with
`npm ci` into .pytest_cache/d/ladder-node-openai; the driver is tests/clients/node_openai/tools.cjs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.service.test_tool_calls import ASK, MAX_NEW, NAMED_ADD, SUM, TOOLS, assert_valid_call, tools_config
from tests.support.servers import RunningServer

pytestmark = pytest.mark.network

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tests" / "clients" / "node_openai"
DEPS = ROOT / ".pytest_cache" / "d" / "ladder-node-openai"
CHOICES: dict[str, Any] = {"required": "required", "named": NAMED_ADD}


@pytest.fixture(scope="module")
def server(default_model: Callable[..., Path]) -> Iterator[RunningServer]:
    with RunningServer(tools_config(default_model)) as running:
        yield running


@pytest.fixture(scope="module")
def node_openai() -> Path:
    """The openai package installed from the lock file (again whenever the lock changes)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed")
    lock = (PACKAGE / "package-lock.json").read_text()
    if not (DEPS / "node_modules" / "openai").is_dir() or _read(DEPS / "package-lock.json") != lock:
        DEPS.mkdir(parents=True, exist_ok=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copy(PACKAGE / name, DEPS / name)
        done = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=DEPS,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0:
            pytest.skip(f"the openai npm package cannot be installed here: {done.stderr.strip()}")
    return DEPS / "node_modules"


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def run_cases(node_modules: Path, server: RunningServer, cases: list[dict[str, Any]]) -> dict[str, Any]:
    """Each case's answer as tools.cjs reports it, by name."""
    base_url = f"http://127.0.0.1:{server.config.http_port}/v1"
    done = subprocess.run(
        ["node", str(PACKAGE / "tools.cjs"), base_url],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "NODE_PATH": str(node_modules)},
    )
    assert done.returncode == 0, done.stderr
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    return {a["name"]: a for a in answers}


def body(choice: str, messages: list[Any], **changes: Any) -> dict[str, Any]:
    return {
        "messages": messages,
        "tools": TOOLS,
        "tool_choice": CHOICES[choice],
        "max_tokens": MAX_NEW,
        "temperature": 0,
        **changes,
    }


def assert_valid_choices(choices: list[dict[str, Any]], choice: str, n: int = 1) -> None:
    """n choices, each a message of calls only, finishing with "tool_calls"; named: one call of it."""
    assert [c["index"] for c in choices] == list(range(n))
    for made in choices:
        assert made["finish_reason"] == "tool_calls" and not made["content"], made
        assert made["tool_calls"], made
        for call in made["tool_calls"]:
            assert call["type"] == "function"
            assert_valid_call(call["name"], call["arguments"], call["id"])
        if choice == "named":
            assert [c["name"] for c in made["tool_calls"]] == ["add"]


def calls_of(choice: dict[str, Any]) -> list[tuple[str, str]]:
    return [(c["name"], c["arguments"]) for c in choice["tool_calls"]]


@pytest.fixture(scope="module")
def answers(node_openai: Path, server: RunningServer) -> dict[str, Any]:
    """Every case in one node process (the SDK loads once)."""
    cases = [
        {
            "name": f"{choice}-{ask}-{'stream' if stream else 'whole'}",
            "body": body(choice, messages),
            "stream": stream,
        }
        for choice in CHOICES
        for ask, messages in (("weather", ASK), ("sum", SUM))
        for stream in (False, True)
    ]
    sampled = {"n": 2, "temperature": 1.0, "seed": 11}
    cases += [
        {
            "name": f"{choice}-sampled-{'stream' if stream else 'whole'}",
            "body": body(choice, ASK, **sampled),
            "stream": stream,
        }
        for choice in CHOICES
        for stream in (False, True)
    ]
    return run_cases(node_openai, server, cases)


@pytest.mark.parametrize("ask", ["weather", "sum"])
@pytest.mark.parametrize("choice", list(CHOICES))
def test_the_node_sdk_gets_valid_calls_unstreamed(answers: dict[str, Any], choice: str, ask: str) -> None:
    assert_valid_choices(answers[f"{choice}-{ask}-whole"]["choices"], choice)


@pytest.mark.parametrize("ask", ["weather", "sum"])
@pytest.mark.parametrize("choice", list(CHOICES))
def test_the_node_sdk_accumulates_streamed_calls_to_the_unstreamed_ones(
    answers: dict[str, Any], choice: str, ask: str
) -> None:
    streamed = answers[f"{choice}-{ask}-stream"]
    whole = answers[f"{choice}-{ask}-whole"]["choices"]
    for choices in (streamed["choices"], streamed["sdk_choices"]):
        assert_valid_choices(choices, choice)
        assert calls_of(choices[0]) == calls_of(whole[0])  # greedy: the same calls
    assert [c["id"] for c in streamed["choices"][0]["tool_calls"]] != [
        c["id"] for c in whole[0]["tool_calls"]
    ]  # a fresh id per call


@pytest.mark.parametrize("stream", ["whole", "stream"])
@pytest.mark.parametrize("choice", list(CHOICES))
def test_every_sampled_choice_gets_calls_of_its_own(
    answers: dict[str, Any], choice: str, stream: str
) -> None:
    answer = answers[f"{choice}-sampled-{stream}"]
    for choices in (answer["choices"], answer.get("sdk_choices", answer["choices"])):
        assert_valid_choices(choices, choice, n=2)
        ids = [call["id"] for made in choices for call in made["tool_calls"]]
        assert len(set(ids)) == len(ids)
