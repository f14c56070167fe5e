"""The Go client (clients/go: stubs generated from the .proto, committed, and the ladder-go example)
against a real server.

The fixture builds ladder-go with clients/go/build.sh: with the system's Go and Debian's packaged Go
sources when they are installed, otherwise with Debian's packages fetched without root into
.pytest_cache/d/ladder-go-deps (GOPATH mode, no module proxy). The binary is cached under
.pytest_cache/d/ladder-go-client/<hash of its sources and the .proto>.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from clients.python import LadderClient, Stopping
from tests.support.client_builds import (
    ROOT,
    assert_printed_as_the_docs_show,
    built_client,
    last_json_line,
    run_build,
)
from tests.support.servers import RunningServer

GO_DIR = ROOT / "clients" / "go"
SOURCES = sorted(p for p in GO_DIR.rglob("*") if p.is_file() and "build" not in p.relative_to(GO_DIR).parts)
WHAT = "Go and grpc-go (Debian's packages)"

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def go_client() -> Path:
    return built_client("go", SOURCES, WHAT)


def run_go(binary: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=60, check=False)


def without_tool_versions(source: str) -> str:
    """The generated code less its header's tool versions (`// \tprotoc        v3.21.12`): a
    system's own protoc may differ in its patch level from Debian's, and the code does not."""
    return re.sub(r"(?m)^// \tprotoc(-gen-go)? +v.*\n", "", source)


def test_the_committed_go_stubs_are_what_the_generator_makes_of_the_proto(
    go_client: Path, tmp_path: Path
) -> None:
    run_build("go", "--generate", str(tmp_path), what=WHAT)
    for name in ("ladder.pb.go", "ladder_grpc.pb.go"):
        committed = GO_DIR / "ladder" / "v1" / name
        fresh = tmp_path / "ladder" / "v1" / name
        assert without_tool_versions(fresh.read_text()) == without_tool_versions(committed.read_text()), (
            f"{committed} is stale: run clients/go/build.sh --generate"
        )


@pytest.mark.parametrize("rpc_flag", [[], ["--stream"]], ids=["Generate", "GenerateStream"])
def test_the_go_client_gets_the_python_client_s_greedy_tokens(
    go_client: Path, server: RunningServer, client: LadderClient, rpc_flag: list[str]
) -> None:
    done = run_go(
        go_client,
        "--address",
        server.address,
        "--max-new-tokens",
        "7",
        "--ignore-eos",
        *rpc_flag,
        "Hello from Go",
    )
    assert done.returncode == 0, done.stderr
    expected = client.generate("Hello from Go", stopping=Stopping(max_new_tokens=7, ignore_eos=True))
    assert expected.text and done.stdout == expected.text + "\n"
    summary = last_json_line(done.stderr)
    assert summary["token_ids"] == list(expected.token_ids)
    assert summary["finish_reason"] == "FINISH_REASON_LENGTH"
    assert summary["completion_tokens"] == 7
    assert_printed_as_the_docs_show(done.stderr, ["token_ids", "finish_reason", "completion_tokens"])


def test_a_go_session_s_prefill_and_two_decodes_give_the_tokens_of_one_generate(
    go_client: Path, server: RunningServer, client: LadderClient
) -> None:
    prompt = "Hello from a Go session"
    done = run_go(
        go_client, "--address", server.address, "--max-new-tokens", "7", "--ignore-eos", "--session", prompt
    )
    assert done.returncode == 0, done.stderr
    expected = client.generate(prompt, stopping=Stopping(max_new_tokens=7, ignore_eos=True))
    summary = last_json_line(done.stderr)
    assert summary["token_ids"] == list(expected.token_ids)
    assert done.stdout == expected.text + "\n"
    assert summary["decode_calls"] == 2
    assert summary["prefill_next_token"] == expected.token_ids[0]  # Decode starts from the same logits
    prompt_tokens = expected.usage.prompt_tokens
    assert summary["session_length"] == prompt_tokens + 7
    assert summary["closed_length"] == prompt_tokens + 7
    assert str(summary["session_id"])
    assert server.stats().sessions_open == 0


@pytest.mark.parametrize(
    "rpc_flag", [[], ["--stream"], ["--session"]], ids=["Generate", "GenerateStream", "Prefill"]
)
def test_the_go_client_reads_a_bad_request_s_reason_and_field(
    go_client: Path, server: RunningServer, rpc_flag: list[str]
) -> None:
    done = run_go(go_client, "--address", server.address, "--tokens", *rpc_flag, "1 2 70000")
    assert done.returncode == 1
    rpc = {"": "Generate", "--stream": "GenerateStream", "--session": "Prefill"}["".join(rpc_flag)]
    assert done.stderr.startswith(f"{rpc} failed: INVALID_ARGUMENT: ")
    assert "70000" in done.stderr
    details = last_json_line(done.stderr)
    assert details["code"] == "INVALID_ARGUMENT"
    assert (details["domain"], details["reason"]) == ("ladder.v1", "TOKEN_OUT_OF_VOCABULARY")
    [violation] = details["field_violations"]  # type: ignore[misc]
    assert violation["field"] == "prompt.tokens.ids"
    assert "70000" in violation["description"]
    assert_printed_as_the_docs_show(done.stderr, ["code", "domain", "reason", "field_violations"])


def test_the_go_client_reads_an_out_of_range_request_s_field(go_client: Path, server: RunningServer) -> None:
    done = run_go(go_client, "--address", server.address, "--max-new-tokens", "100000", "Hello")
    assert done.returncode == 1
    details = last_json_line(done.stderr)
    assert (details["code"], details["reason"]) == ("OUT_OF_RANGE", "MAX_NEW_TOKENS_OVER_LIMIT")
    assert [v["field"] for v in details["field_violations"]] == ["stopping.max_new_tokens"]  # type: ignore[union-attr]


def test_the_go_client_rejects_bad_arguments_before_calling(go_client: Path) -> None:
    done = run_go(go_client, "--tokens", "one two")
    assert done.returncode == 2
    assert "--tokens wants space-separated token ids" in done.stderr


def test_the_go_client_generates_over_tls_with_a_bearer_token(
    go_client: Path, tls_token_server: tuple[RunningServer, Path]
) -> None:
    server, ca = tls_token_server
    done = run_go(
        go_client,
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
def test_the_go_client_without_a_known_token_is_unauthenticated_with_its_reason(
    go_client: Path, tls_token_server: tuple[RunningServer, Path], token: list[str]
) -> None:
    server, ca = tls_token_server
    done = run_go(go_client, "--address", server.address, "--tls-ca", str(ca), *token, "Hello")
    assert done.returncode == 1
    details = last_json_line(done.stderr)
    reason = "TOKEN_UNKNOWN" if token else "TOKEN_MISSING"
    assert (details["code"], details["reason"]) == ("UNAUTHENTICATED", reason)
