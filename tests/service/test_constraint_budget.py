"""Constraint compiles through a real server (issue #39): a schema too costly to compile is
INVALID_ARGUMENT within about --constraint-compile-seconds, a compile whose caller left stops, a
burst of hostile schemas leaves tokenization answering (compiles have threads of their own), and
the same schema asked by two callers compiles for the one who stays when the other leaves.

One in-process server for the module, its compile budget BUDGET_S of CPU time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from proto.ladder.v1 import ladder_pb2 as pb
from tests.support.hostile import fanned_schema
from tests.support.rich_errors import details_of
from tests.support.servers import RunningServer, server_config
from tests.support.waiting import wait_for

BUDGET_S = 3.0
TEXT = pb.GenerateRequest(prompt=pb.Prompt(text="hello"), stopping=pb.StoppingOptions(max_new_tokens=2))


@pytest.fixture(scope="module")
def server(served_model: Path) -> Iterator[RunningServer]:
    with RunningServer(server_config(served_model, constraint_compile_seconds=BUDGET_S)) as running:
        yield running


def constrained(schema: str, new: int = 2) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        prompt=pb.Prompt(text="Hi"),
        constraint=pb.Constraint(json_schema=schema),
        stopping=pb.StoppingOptions(max_new_tokens=new),
    )


def compiles_running(server: RunningServer) -> int:
    return server.server.serving.constraints.running


def test_a_schema_over_the_compile_budget_is_invalid_argument_within_about_the_budget(
    server: RunningServer,
) -> None:
    started = time.perf_counter()
    details = details_of(lambda: server.stub.Generate(constrained(fanned_schema(title="over")), timeout=60))
    assert details.code == grpc.StatusCode.INVALID_ARGUMENT and details.reason == "CONSTRAINT_TOO_LARGE"
    assert details.fields == ["constraint.json_schema"] and "3 s of CPU time" in details.message
    assert time.perf_counter() - started < BUDGET_S * 3 + 1


def test_a_compile_whose_caller_left_stops(server: RunningServer) -> None:
    wait_for(lambda: compiles_running(server) == 0, what="no compile running")
    with pytest.raises(grpc.RpcError) as left:
        server.stub.Generate(constrained(fanned_schema(title="left")), timeout=0.5)
    assert left.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # Left alone it would run BUDGET_S of CPU time; abandoned, it stops at its next check.
    wait_for(lambda: compiles_running(server) == 0, 1.5, "the abandoned compile to stop")


def test_a_burst_of_hostile_schemas_leaves_tokenization_answering(server: RunningServer) -> None:
    hostile = [constrained(fanned_schema(title=f"burst {i}")) for i in range(6)]
    with ThreadPoolExecutor(6) as pool:
        calls = [pool.submit(server.stub.Generate, request, timeout=2.0) for request in hostile]
        wait_for(lambda: compiles_running(server) >= 2, what="compiles running")
        started = time.perf_counter()
        ids = server.stub.Tokenize(pb.TokenizeRequest(text="hello ladder"), timeout=10).ids
        reply = server.stub.Generate(TEXT, timeout=10)
        answered = time.perf_counter() - started
        assert compiles_running(server) >= 1  # they were answered while compiles ran
        codes = [_code(call.exception()) for call in calls]
    assert ids and len(reply.token_ids) == 2 and answered < 3.0
    assert set(codes) <= {grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INVALID_ARGUMENT}


def test_one_schema_asked_twice_compiles_for_the_caller_who_stays_when_the_other_leaves(
    server: RunningServer,
) -> None:
    schema = fanned_schema(6, title="shared")  # ~1 s of CPU time: within the budget
    wait_for(lambda: compiles_running(server) == 0, what="no compile running")
    misses = server.server.serving.constraints.stats().misses
    with ThreadPoolExecutor(2) as pool:
        leaving = pool.submit(server.stub.Generate, constrained(schema), timeout=0.3)
        wait_for(lambda: compiles_running(server) >= 1, what="the first caller's compile")
        staying = pool.submit(server.stub.Generate, constrained(schema), timeout=60)
        assert _code(leaving.exception()) == grpc.StatusCode.DEADLINE_EXCEEDED
        reply = staying.result()
    assert reply.token_ids and reply.finish_reason != pb.FINISH_REASON_UNSPECIFIED
    # Compiled twice: by the caller who left (abandoned midway), then by the one who waited for it.
    assert server.server.serving.constraints.stats().misses == misses + 2


def _code(error: BaseException | None) -> grpc.StatusCode | None:
    return error.code() if isinstance(error, grpc.RpcError) else None
