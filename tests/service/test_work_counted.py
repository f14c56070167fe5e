"""Work is counted where it is done, however the call ends: the tokens and prefill forwards of a
cancelled, timed-out or killed call reach the metrics and GetEngineStats, each sample of n counts
once in the length histogram and the finish reasons, and the access log says how a call ended.

A stream of LONG tokens takes the generated model most of a second; each test ends the call while
the engine worker is held (`frozen`), so the call cannot finish first whatever the machine's speed."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from proto.ladder.v1 import ladder_pb2 as pb
from tests.service.test_metrics import Endpoint, Scraped
from tests.support.prompts import greedy_request, prompt_ids
from tests.support.servers import RunningServer, server_config
from tests.support.waiting import wait_for

KILLED_CLIENT = """
import sys, grpc
from proto.ladder.v1 import ladder_pb2 as pb, ladder_pb2_grpc
stub = ladder_pb2_grpc.LadderStub(grpc.insecure_channel(sys.argv[1]))
request = pb.GenerateRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=[5, 6, 7, 8])),
                             stopping=pb.StoppingOptions(max_new_tokens=960, ignore_eos=True))
for i, event in enumerate(stub.GenerateStream(request)):
    if i == 10:
        print("ten", flush=True)
        sys.stdin.read()  # held here until killed
"""
LONG = 960  # new tokens: within the generated model's 1,024 positions with the prompts here


@pytest.fixture
def served(served_model: Path) -> Iterator[Endpoint]:
    running = RunningServer(server_config(served_model, max_sessions=4, max_new_tokens=LONG))
    try:
        yield Endpoint(running)
    finally:
        running.close()


def settled(served: Endpoint, method: str, reason: str) -> Scraped:
    """The scrape once the call has been counted as ended with `reason` and its job has stopped
    (the engine's generated-token total equals the metric: nothing is still being added)."""
    found: list[Scraped] = []

    def counted() -> bool:
        if served.scrape().get("ladder_finished_total", method=method, reason=reason) != 1:
            return False
        stats = served.running.stub.GetEngineStats(pb.GetEngineStatsRequest())
        found.append(served.scrape())
        return found[-1]("ladder_generated_tokens_total") == stats.generated_tokens

    wait_for(counted, what=f"{method} counted as {reason}")
    return found[-1]


def calls(served: Endpoint, method: str, code: str) -> float | None:
    return served.scrape().get("ladder_calls_total", protocol="grpc", method=method, code=code)


def test_a_cancelled_stream_counts_the_tokens_and_forwards_it_made(served: Endpoint) -> None:
    stream = served.running.stub.GenerateStream(greedy_request(prompt_ids(30, seed=1), LONG))
    received = [next(stream) for _ in range(20)]
    with served.running.frozen():
        stream.cancel()
        wait_for(lambda: calls(served, "GenerateStream", "CANCELLED") == 1, what="the call ended")
    m = settled(served, "GenerateStream", "cancelled")
    assert LONG > m("ladder_generated_tokens_total") >= len(received)
    assert m("ladder_prefill_forwards_total") >= 1
    assert m("ladder_prompt_tokens_total") == 30
    assert m("ladder_request_generated_tokens_count", method="GenerateStream") == 1
    assert m("ladder_request_generated_tokens_sum", method="GenerateStream") >= len(received)


def test_a_stream_past_its_deadline_counts_its_tokens_as_deadline_exceeded(served: Endpoint) -> None:
    stream = served.running.stub.GenerateStream(greedy_request(prompt_ids(40, seed=2), LONG), timeout=3.0)
    received = [next(stream) for _ in range(10)]
    with served.running.frozen():
        with pytest.raises(grpc.RpcError) as ended:
            for _ in stream:
                pass
        assert ended.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        wait_for(lambda: calls(served, "GenerateStream", "DEADLINE_EXCEEDED") == 1, what="the call ended")
    m = settled(served, "GenerateStream", "deadline_exceeded")
    assert LONG > m("ladder_generated_tokens_total") >= len(received)
    assert m("ladder_prefill_forwards_total") >= 1


def test_a_killed_client_s_tokens_are_counted(served: Endpoint) -> None:
    client = subprocess.Popen(
        [sys.executable, "-c", KILLED_CLIENT, served.running.address],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert client.stdout is not None and client.stdout.readline().strip() == "ten"
        with served.running.frozen():
            client.kill()
            client.wait()
            wait_for(lambda: calls(served, "GenerateStream", "CANCELLED") == 1, what="the call ended")
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    m = settled(served, "GenerateStream", "cancelled")
    assert LONG > m("ladder_generated_tokens_total") >= 11


def test_every_sample_of_n_counts_once(served: Endpoint) -> None:
    request = greedy_request(prompt_ids(30, seed=3), 5)
    request.n = 3
    request.sampling.temperature = 1.0
    reply = served.running.stub.Generate(request)
    assert reply.usage.completion_tokens == 15
    m = served.scrape()
    g = {"method": "Generate"}
    assert m("ladder_generated_tokens_total") == 15
    assert m("ladder_request_generated_tokens_count", **g) == 3
    assert m("ladder_request_generated_tokens_sum", **g) == 15
    assert m("ladder_finished_total", method="Generate", reason="length") == 3
    assert m("ladder_calls_total", protocol="grpc", method="Generate", code="OK") == 1


def test_a_refused_call_counts_no_generation(served: Endpoint) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        served.running.stub.Generate(greedy_request([], 2))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    m = served.scrape()
    assert m.get("ladder_finished_total", method="Generate", reason="error") is None
    assert m("ladder_generated_tokens_total") == 0
