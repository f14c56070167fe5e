"""The Java client (clients/java: classes generated from the .proto by protoc and grpc-java's plugin,
and the LadderExample program) against a real server.

The fixture builds it with clients/java/build.sh: javac against the system's grpc-java jars when they
are installed, otherwise against Debian's packages (and a JDK, if none is installed) fetched without
root into .pytest_cache/d/ladder-java-deps. The build is cached under
.pytest_cache/d/ladder-java-client/<hash of its sources and the .proto>.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from clients.python import LadderClient, Stopping
from tests.support.client_builds import ROOT, assert_printed_as_the_docs_show, built_client, last_json_line
from tests.support.servers import RunningServer

JAVA_DIR = ROOT / "clients" / "java"

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def java_client() -> Path:
    sources = [JAVA_DIR / "build.sh", *sorted((JAVA_DIR / "src").rglob("*.java"))]
    return built_client("java", sources, "grpc-java (Debian's packages)")


def run_java(launcher: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(launcher), *args], capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("rpc_flag", [[], ["--stream"]], ids=["Generate", "GenerateStream"])
def test_the_java_client_gets_the_python_client_s_greedy_tokens(
    java_client: Path, server: RunningServer, client: LadderClient, rpc_flag: list[str]
) -> None:
    done = run_java(
        java_client,
        "--address",
        server.address,
        "--max-new-tokens",
        "7",
        "--ignore-eos",
        *rpc_flag,
        "Hello from Java",
    )
    assert done.returncode == 0, done.stderr
    expected = client.generate("Hello from Java", stopping=Stopping(max_new_tokens=7, ignore_eos=True))
    assert expected.text and done.stdout == expected.text + "\n"
    summary = last_json_line(done.stderr)
    assert summary["token_ids"] == list(expected.token_ids)
    assert summary["finish_reason"] == "FINISH_REASON_LENGTH"
    assert summary["completion_tokens"] == 7
    assert_printed_as_the_docs_show(done.stderr, ["token_ids", "finish_reason", "completion_tokens"])


def test_a_java_session_s_prefill_and_two_decodes_give_the_tokens_of_one_generate(
    java_client: Path, server: RunningServer, client: LadderClient
) -> None:
    prompt = "Hello from a Java session"
    done = run_java(
        java_client, "--address", server.address, "--max-new-tokens", "7", "--ignore-eos", "--session", prompt
    )
    assert done.returncode == 0, done.stderr
    expected = client.generate(prompt, stopping=Stopping(max_new_tokens=7, ignore_eos=True))
    summary = last_json_line(done.stderr)
    assert summary["token_ids"] == list(expected.token_ids)
    assert done.stdout == expected.text + "\n"
    assert summary["decode_calls"] == 2
    assert summary["prefill_next_token"] == expected.token_ids[0]  # Decode starts from the same logits
    prompt_tokens = expected.usage.prompt_tokens
    assert summary["session_length"] == summary["closed_length"] == prompt_tokens + 7
    assert str(summary["session_id"])
    assert server.stats().sessions_open == 0


@pytest.mark.parametrize(
    "rpc_flag", [[], ["--stream"], ["--session"]], ids=["Generate", "GenerateStream", "Prefill"]
)
def test_the_java_client_reads_a_bad_request_s_reason_and_field(
    java_client: Path, server: RunningServer, rpc_flag: list[str]
) -> None:
    done = run_java(java_client, "--address", server.address, "--tokens", *rpc_flag, "1 2 70000")
    assert done.returncode == 1, done.stderr
    rpc = {"": "Generate", "--stream": "GenerateStream", "--session": "Prefill"}["".join(rpc_flag)]
    assert done.stderr.startswith(f"{rpc} failed: INVALID_ARGUMENT: ")
    details = last_json_line(done.stderr)
    assert details["code"] == "INVALID_ARGUMENT"
    assert (details["domain"], details["reason"]) == ("ladder.v1", "TOKEN_OUT_OF_VOCABULARY")
    [violation] = details["field_violations"]  # type: ignore[misc]
    assert violation["field"] == "prompt.tokens.ids"
    assert "70000" in violation["description"]
    assert_printed_as_the_docs_show(done.stderr, ["code", "domain", "reason", "field_violations"])


def test_the_java_client_rejects_bad_arguments_before_calling(java_client: Path) -> None:
    done = run_java(java_client, "--max-new-tokens", "many", "hello")
    assert done.returncode == 2
    assert "--max-new-tokens wants a number >= 0, got 'many'" in done.stderr


def test_the_java_client_generates_over_tls_with_a_bearer_token(
    java_client: Path, tls_token_server: tuple[RunningServer, Path]
) -> None:
    server, ca = tls_token_server
    done = run_java(
        java_client,
        "--address",
        server.address,
        "--tls-ca",
        str(ca),
        "--token",
        "tok-alice",
        "--max-new-tokens",
        "3",
        "--ignore-eos",
        "Hello over TLS",
    )
    assert done.returncode == 0, done.stderr
    assert last_json_line(done.stderr)["completion_tokens"] == 3


@pytest.mark.parametrize("token", [[], ["--token", "tok-mallory"]], ids=["missing", "unknown"])
def test_the_java_client_without_a_known_token_is_unauthenticated_with_its_reason(
    java_client: Path, tls_token_server: tuple[RunningServer, Path], token: list[str]
) -> None:
    server, ca = tls_token_server
    done = run_java(java_client, "--address", server.address, "--tls-ca", str(ca), *token, "Hello")
    assert done.returncode == 1
    details = last_json_line(done.stderr)
    reason = "TOKEN_UNKNOWN" if token else "TOKEN_MISSING"
    assert (details["code"], details["reason"]) == ("UNAUTHENTICATED", reason)
