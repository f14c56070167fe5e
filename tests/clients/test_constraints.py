"""Structured output from the Python clients and the `ladder` CLI, against a real server: a
`Constraint` (or a CLI flag) becomes the request's constraint, and what comes back matches it."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from clients.python import AsyncLadderClient, Constraint, LadderClient, Sampling, Stopping, completion_of
from clients.python.cli import main
from proto.ladder.v1 import ladder_pb2 as pb
from tests.support.servers import RunningServer

SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["a"],
    "additionalProperties": False,
}
GRAMMAR = 'root ::= "(" [0-9]{1,3} ")"'
KINDS: dict[str, tuple[Constraint, Callable[[str], object]]] = {
    "json_schema": (Constraint(json_schema=SCHEMA), lambda text: json.loads(text)["a"] in range(100)),
    "regex": (Constraint(regex=r"[a-z]{3}-\d{2}"), lambda text: re.fullmatch(r"[a-z]{3}-\d{2}", text)),
    "choice": (Constraint(choice=["yes", "no"]), lambda text: text in ("yes", "no")),
    "grammar": (Constraint(grammar=GRAMMAR), lambda text: re.fullmatch(r"\([0-9]{1,3}\)", text)),
}
STOPPING = Stopping(max_new_tokens=40)


def test_a_constraint_is_exactly_one_kind() -> None:
    with pytest.raises(ValueError, match="one of json_schema"):
        Constraint()
    with pytest.raises(ValueError, match="'regex', 'choice'"):
        Constraint(regex="a", choice=["a"])
    assert Constraint(json_schema=SCHEMA).to_proto() == pb.Constraint(json_schema=json.dumps(SCHEMA))
    assert Constraint(json_schema='{"type": "null"}').to_proto().json_schema == '{"type": "null"}'
    assert Constraint(json_schema=True).to_proto().json_schema == "true"
    assert Constraint(choice=("a", "b")).to_proto() == pb.Constraint(choice=pb.Choices(options=["a", "b"]))


@pytest.mark.parametrize("kind", KINDS)
def test_generate_with_a_constraint_sends_it_and_every_sample_matches(
    server: RunningServer, client: LadderClient, kind: str
) -> None:
    constraint, matches = KINDS[kind]
    sampling = Sampling(temperature=1.0, seed=3)
    done = client.generate("Hello", sampling=sampling, stopping=STOPPING, n=2, constraint=constraint)
    assert all(matches(s.text) and s.finish_reason == pb.FINISH_REASON_STOP for s in done.samples)
    raw = pb.GenerateRequest(
        prompt=pb.Prompt(text="Hello"),
        sampling=sampling.to_proto(),
        stopping=STOPPING.to_proto(),
        n=2,
        constraint=constraint.to_proto(),
    )
    assert [s.token_ids for s in done.samples] == [s.token_ids for s in server.stub.Generate(raw).samples]


def test_generate_stream_and_a_session_decode_take_a_constraint(client: LadderClient) -> None:
    constraint, matches = KINDS["json_schema"]
    streamed = completion_of(client.generate_stream("Hello", stopping=STOPPING, constraint=constraint))
    assert matches(streamed.text)
    _, ready = client.prefill(["Some text, then a number: "])
    try:
        decoded = completion_of(client.decode(ready.session_id, 12, constraint=Constraint(regex="[0-9]{4}")))
        assert re.fullmatch("[0-9]{4}", decoded.text) and decoded.finish_reason == pb.FINISH_REASON_STOP
    finally:
        client.close_session(ready.session_id)


def test_the_async_client_takes_a_constraint_on_generate_and_decode(server: RunningServer) -> None:
    async def run() -> tuple[pb.Completion, pb.Completion]:
        async with AsyncLadderClient(server.address) as aclient:
            unary = await aclient.generate("Hello", stopping=STOPPING, constraint=KINDS["choice"][0])
            _, ready = await aclient.prefill(["A code: "])
            done = pb.Completion()
            async for event in aclient.decode(ready.session_id, 12, constraint=KINDS["grammar"][0]):
                done = event.done if event.WhichOneof("event") == "done" else done
            await aclient.close_session(ready.session_id)
            return unary, done

    unary, decoded = asyncio.run(run())
    assert KINDS["choice"][1](unary.text) and KINDS["grammar"][1](decoded.text)


@pytest.mark.parametrize(
    ("flags", "kind"),
    [
        (["--json-schema", json.dumps(SCHEMA)], "json_schema"),
        (["--regex", r"[a-z]{3}-\d{2}"], "regex"),
        (["--choice", "yes,no"], "choice"),
        (["--grammar", GRAMMAR], "grammar"),
    ],
)
def test_ladder_generate_takes_a_constraint_flag(
    server: RunningServer, capsys: pytest.CaptureFixture[str], flags: list[str], kind: str
) -> None:
    assert main(["generate", "--address", server.address, *flags, "Hello"]) == 0
    assert KINDS[kind][1](capsys.readouterr().out.removesuffix("\n"))


def test_ladder_generate_reads_a_schema_or_a_grammar_from_a_file(
    server: RunningServer, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "schema.json").write_text(json.dumps(SCHEMA))
    (tmp_path / "code.gbnf").write_text(GRAMMAR + "\n")
    files = (("--json-schema", "schema.json", "json_schema"), ("--grammar", "code.gbnf", "grammar"))
    for flag, name, kind in files:
        assert main(["generate", "--address", server.address, flag, str(tmp_path / name), "Hello"]) == 0
        assert KINDS[kind][1](capsys.readouterr().out.removesuffix("\n"))


def test_ladder_generate_refuses_two_constraints_and_reports_a_bad_one(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as usage:
        main(["generate", "--address", server.address, "--regex", "a", "--choice", "a,b", "Hello"])
    assert usage.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    assert main(["generate", "--address", server.address, "--regex", "(a", "Hello"]) == 1
    assert "INVALID_ARGUMENT: the regex does not parse" in capsys.readouterr().err
