"""The C++ client (clients/cpp, stubs generated from the .proto by grpc_cpp_plugin) against a real server.

The fixture builds it with clients/cpp/build.sh: against the system's gRPC C++ packages when they are
installed, otherwise against Debian's packages fetched without root into .pytest_cache/d/ladder-cpp-deps.
The binary is cached under .pytest_cache/d/ladder-cpp-client/<hash of its sources, the .proto and the
packages' path its rpath names>.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from clients.python import Constraint, LadderClient, Stopping
from tests.support.client_builds import ROOT, built_client
from tests.support.client_constraints import CONSTRAINT_FLAGS, assert_same_as_python_client
from tests.support.servers import RunningServer

CPP_DIR = ROOT / "clients" / "cpp"
SOURCES = [CPP_DIR / "ladder_client.cc", CPP_DIR / "Makefile", CPP_DIR / "build.sh"]

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def cpp_client() -> Path:
    return built_client("cpp", SOURCES, "the gRPC C++ packages")


def run_cpp(binary: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("rpc_flag", [[], ["--stream"]], ids=["Generate", "GenerateStream"])
def test_the_cpp_client_gets_the_same_tokens_as_the_python_client(
    cpp_client: Path, server: RunningServer, client: LadderClient, rpc_flag: list[str]
) -> None:
    done = run_cpp(
        cpp_client,
        "--address",
        server.address,
        "--max-new-tokens",
        "7",
        "--ignore-eos",
        *rpc_flag,
        "Hello from C++",
    )
    assert done.returncode == 0, done.stderr
    expected = client.generate("Hello from C++", stopping=Stopping(max_new_tokens=7, ignore_eos=True))
    assert expected.text and done.stdout == expected.text + "\n"
    summary = json.loads(done.stderr.strip().splitlines()[-1])
    assert summary["token_ids"] == list(expected.token_ids)
    assert summary["finish_reason"] == "FINISH_REASON_LENGTH"
    assert summary["completion_tokens"] == 7


def test_the_cpp_client_reports_a_bad_request_with_its_status_name(
    cpp_client: Path, server: RunningServer
) -> None:
    done = run_cpp(cpp_client, "--address", server.address, "--tokens", "1 2 70000")
    assert done.returncode == 1
    assert done.stderr.startswith("Generate failed: INVALID_ARGUMENT: ")
    assert "70000" in done.stderr


def test_the_cpp_client_rejects_bad_arguments_before_calling(cpp_client: Path) -> None:
    done = run_cpp(cpp_client, "--max-new-tokens", "many", "hello")
    assert done.returncode == 2
    assert "--max-new-tokens wants a number >= 0, got 'many'" in done.stderr
    assert "usage: ladder-cpp" in done.stderr


@CONSTRAINT_FLAGS
def test_the_cpp_client_sends_a_constraint_as_the_python_client_does(
    cpp_client: Path, server: RunningServer, client: LadderClient, flags: list[str], constraint: Constraint
) -> None:
    done = run_cpp(cpp_client, "--address", server.address, "--max-new-tokens", "20", *flags, "Hello")
    assert_same_as_python_client(done, client, constraint)
