"""What the C++ and Node example clients are checked against for constraints: each constraint
kind's flags, and the run's output and summary equal to the Python client's for the same request."""

from __future__ import annotations

import json
import subprocess

import pytest

from clients.python import Constraint, LadderClient, Stopping

SCHEMA = '{"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 3}'
GRAMMAR = 'root ::= "(" [0-9]{1,3} ")"'

CONSTRAINT_FLAGS = pytest.mark.parametrize(
    ("flags", "constraint"),
    [
        (["--json-schema", SCHEMA], Constraint(json_schema=SCHEMA)),
        (["--regex", r"[a-z]{3}-\d{2}"], Constraint(regex=r"[a-z]{3}-\d{2}")),
        (["--choice", "yes,no,maybe"], Constraint(choice=["yes", "no", "maybe"])),
        (["--grammar", GRAMMAR], Constraint(grammar=GRAMMAR)),
    ],
    ids=["json-schema", "regex", "choice", "grammar"],
)


def assert_same_as_python_client(
    done: subprocess.CompletedProcess[str],
    client: LadderClient,
    constraint: Constraint,
    prompt: str = "Hello",
    new: int = 20,
) -> None:
    """The example client's run printed the Python client's text, and its summary line (the last on
    stderr) the same token ids and a stop (the constraint completed)."""
    assert done.returncode == 0, done.stderr
    expected = client.generate(prompt, stopping=Stopping(max_new_tokens=new), constraint=constraint)
    assert done.stdout == expected.text + "\n"
    summary = json.loads(done.stderr.strip().splitlines()[-1])
    assert summary["token_ids"] == list(expected.token_ids)
    assert summary["finish_reason"] == "FINISH_REASON_STOP"
