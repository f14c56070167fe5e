"""The C++ client (clients/cpp, stubs generated from the .proto by grpc_cpp_plugin) against a real server.

The fixture builds it with clients/cpp/build.sh: against the system's gRPC C++ packages when they are
installed, otherwise against Debian's packages fetched without root into .pytest_cache/d/ladder-cpp-deps.
The binary is cached under .pytest_cache/d/ladder-cpp-client/<hash of its sources, the .proto and the
packages' path its rpath names>.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from clients.python import Constraint, LadderClient, Stopping
from tests.support.client_constraints import CONSTRAINT_FLAGS, assert_same_as_python_client
from tests.support.servers import RunningServer

ROOT = Path(__file__).resolve().parents[2]
CPP_DIR = ROOT / "clients" / "cpp"
SOURCES = [CPP_DIR / "ladder_client.cc", CPP_DIR / "Makefile", CPP_DIR / "build.sh",
           ROOT / "proto" / "ladder" / "v1" / "ladder.proto"]
CACHE = ROOT / ".pytest_cache" / "d"
UNOBTAINABLE = 3  # build.sh's exit status when the gRPC C++ packages cannot be had

pytestmark = pytest.mark.network


DEPS = CACHE / "ladder-cpp-deps"


def sources_key() -> str:
    """The sources, and where the binary's rpath points (a build from a checkout elsewhere, sharing
    this cache, points at libraries that may be gone)."""
    digest = hashlib.sha256(str(DEPS).encode())
    for source in SOURCES:
        digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="module")
def cpp_client() -> Path:
    build_dir = CACHE / "ladder-cpp-client" / sources_key()
    for stale in build_dir.parent.glob("*"):  # builds of earlier sources
        if stale != build_dir:
            shutil.rmtree(stale, ignore_errors=True)
    env = {**os.environ, "LADDER_CPP_DEPS": str(DEPS)}
    done = subprocess.run([str(CPP_DIR / "build.sh"), str(build_dir)], capture_output=True, text=True,
                          env=env, timeout=1200, check=False)
    if done.returncode == UNOBTAINABLE:
        pytest.skip(f"the gRPC C++ packages cannot be obtained here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    return Path(done.stdout.strip())


def run_cpp(binary: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("rpc_flag", [[], ["--stream"]], ids=["Generate", "GenerateStream"])
def test_the_cpp_client_gets_the_same_tokens_as_the_python_client(cpp_client: Path, server: RunningServer,
                                                                  client: LadderClient,
                                                                  rpc_flag: list[str]) -> None:
    done = run_cpp(cpp_client, "--address", server.address, "--max-new-tokens", "7", "--ignore-eos",
                   *rpc_flag, "Hello from C++")
    assert done.returncode == 0, done.stderr
    expected = client.generate("Hello from C++", stopping=Stopping(max_new_tokens=7, ignore_eos=True))
    assert expected.text and done.stdout == expected.text + "\n"
    summary = json.loads(done.stderr.strip().splitlines()[-1])
    assert summary["token_ids"] == list(expected.token_ids)
    assert summary["finish_reason"] == "FINISH_REASON_LENGTH"
    assert summary["completion_tokens"] == 7


def test_the_cpp_client_reports_a_bad_request_with_its_status_name(cpp_client: Path,
                                                                   server: RunningServer) -> None:
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
        cpp_client: Path, server: RunningServer, client: LadderClient, flags: list[str],
        constraint: Constraint) -> None:
    done = run_cpp(cpp_client, "--address", server.address, "--max-new-tokens", "20", *flags, "Hello")
    assert_same_as_python_client(done, client, constraint)
