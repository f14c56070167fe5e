"""The edges of the KV capacity, through a real server: what fits is served, what does not is
refused with a message that says why, and a generation that fills the cache says so."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from proto.ladder.v1 import ladder_pb2 as pb
from tests.support.prompts import greedy_request, prompt_ids
from tests.support.servers import RunningServer, server_config
from tests.support.sessions import decode, part, prefill

CAPACITY = 128


@pytest.fixture(scope="module")
def small(served_model: Path) -> Iterator[RunningServer]:
    running = RunningServer(server_config(served_model, capacity=CAPACITY, warm_up=False))
    yield running
    running.close()


def refusal(call: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        call()  # type: ignore[operator]
    return err.value


def test_a_prompt_of_exactly_the_capacity_gets_the_one_token_its_logits_choose(small: RunningServer) -> None:
    reply = small.stub.Generate(greedy_request(prompt_ids(CAPACITY, seed=6), 0))
    assert len(reply.token_ids) == 1
    assert reply.finish_reason == pb.FINISH_REASON_CAPACITY


def test_a_generation_that_fills_the_cache_ends_with_capacity_not_length(small: RunningServer) -> None:
    reply = small.stub.Generate(greedy_request(prompt_ids(CAPACITY - 5, seed=7), 0))
    assert len(reply.token_ids) == 6  # five fill the cache, the sixth needs no slot
    assert reply.finish_reason == pb.FINISH_REASON_CAPACITY
    asked = small.stub.Generate(greedy_request(prompt_ids(CAPACITY - 5, seed=7), 6))
    assert list(asked.token_ids) == list(reply.token_ids)


def test_asking_for_more_than_fits_is_out_of_range_and_says_how_many_do(small: RunningServer) -> None:
    err = refusal(lambda: small.stub.Generate(greedy_request(prompt_ids(CAPACITY - 5, seed=7), 7)))
    assert err.code() == grpc.StatusCode.OUT_OF_RANGE
    assert "the prompt's 123 tokens + 7 new tokens" in err.details() and "at most 6" in err.details()


def test_decode_errors_speak_of_the_sessions_tokens(small: RunningServer) -> None:
    session = prefill(small, part(prompt_ids(CAPACITY - 2, seed=8)))[-1].done.session_id
    err = refusal(lambda: decode(small, session, 4))
    assert err.code() == grpc.StatusCode.OUT_OF_RANGE
    assert f"session {session}'s 126 tokens + 4 new tokens" in err.details()
    assert "prompt" not in err.details()
    tokens, done = decode(small, session, 3)
    assert len(tokens) == 3 and done.finish_reason == pb.FINISH_REASON_CAPACITY
    err = refusal(lambda: decode(small, session, 1))
    assert err.code() == grpc.StatusCode.OUT_OF_RANGE
    assert "full KV capacity" in err.details() and "rewind" in err.details()
    small.stub.CloseSession(pb.CloseSessionRequest(session_id=session))
