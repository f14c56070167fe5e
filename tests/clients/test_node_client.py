"""The Node example (@grpc/grpc-js, proto loaded at run time) gets text back from a real server."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from clients.python import Constraint, LadderClient, Logprobs, Sampling, Stopping
from tests.support.client_constraints import CONSTRAINT_FLAGS, assert_same_as_python_client
from tests.support.servers import RunningServer

pytestmark = pytest.mark.network

NODE_DIR = Path(__file__).resolve().parents[2] / "clients" / "node"


@pytest.fixture(scope="module")
def node_example() -> Path:
    """clients/node with its packages installed from the lock file (a fresh clone has no node_modules)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed")
    if not (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir():
        subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=NODE_DIR,
            check=True,
            timeout=300,
        )
    return NODE_DIR / "generate.js"


def test_the_node_client_gets_the_same_text_as_the_python_client(
    node_example: Path, server: RunningServer, client: LadderClient
) -> None:
    cmd = [
        "node",
        str(node_example),
        "--address",
        server.address,
        "--max-new-tokens",
        "7",
        "--ignore-eos",
        "Hello from Node",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    expected = client.generate("Hello from Node", stopping=Stopping(max_new_tokens=7, ignore_eos=True))
    assert expected.text and done.stdout == expected.text + "\n"
    summary = json.loads(done.stderr.strip().splitlines()[-1])
    assert summary["token_ids"] == list(expected.token_ids)
    assert summary["finish_reason"] == "FINISH_REASON_LENGTH"


def test_the_node_client_reports_a_bad_request_with_its_status(
    node_example: Path, server: RunningServer
) -> None:
    cmd = ["node", str(node_example), "--address", server.address, "--tokens", "1 2 70000"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert "INVALID_ARGUMENT" in done.stderr


def test_the_node_samples_example_streams_each_samples_tokens_with_logprobs(
    node_example: Path, server: RunningServer, client: LadderClient
) -> None:
    cmd = [
        "node",
        str(node_example.parent / "samples.js"),
        "--address",
        server.address,
        "--n",
        "2",
        "--top",
        "3",
        "--max-new-tokens",
        "4",
        "Hello from Node",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    sampling = Sampling(temperature=0.8, min_p=0.05, presence_penalty=0.5, frequency_penalty=0.3, seed=42)
    expected = client.generate(
        "Hello from Node",
        sampling=sampling,
        n=2,
        logprobs=Logprobs(top=3),
        stopping=Stopping(max_new_tokens=4, ignore_eos=True),
    )
    for sample in (0, 1):
        mine = [line for line in lines if line["sample"] == sample]
        assert [line["id"] for line in mine] == list(expected.samples[sample].token_ids)
        assert [len(line["top"]) for line in mine] == [3] * 4
        assert [line["logprob"] for line in mine] == pytest.approx(
            [p.logprob for p in expected.samples[sample].logprobs]
        )


@CONSTRAINT_FLAGS
def test_the_node_client_sends_a_constraint_as_the_python_client_does(
    node_example: Path, server: RunningServer, client: LadderClient, flags: list[str], constraint: Constraint
) -> None:
    cmd = ["node", str(node_example), "--address", server.address, "--max-new-tokens", "20", *flags, "Hello"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert_same_as_python_client(done, client, constraint)
