"""coalesce_tokens: the tokens ready together travel in one TokenEvent, and nothing else changes.

A stream that asks for it carries exactly the tokens, texts, indices, samples and Completion of the
same call without it; only how many tokens share a message differs. The server never holds a
token back to fill a message: a message carries what the worker had delivered by the event
loop's turn (Scheduler.batches), so a decode round's tokens of n samples share one.
"""

from __future__ import annotations

import grpc
import pytest

from clients.python.messages import tokens_of
from proto.ladder.v1 import ladder_pb2 as pb
from service.events import PrefillTally, TokenOut
from service.front.progress import Progress
from service.metrics import Metrics
from tests.support.prompts import greedy_request, prompt_ids
from tests.support.servers import RunningServer
from tests.support.sessions import part, prefill

NEW = 24


def coalesced(request: pb.GenerateRequest) -> pb.GenerateRequest:
    request.coalesce_tokens = True
    return request


def token_fields(events: list[pb.TokenEvent]) -> list[tuple[int, str, int, int]]:
    return [(t.id, t.text, t.index, t.sample) for event in events for t in tokens_of(event)]


def test_a_coalesced_stream_carries_exactly_the_tokens_of_a_plain_one(server: RunningServer) -> None:
    request = greedy_request(prompt_ids(40, seed=61), NEW)
    plain = list(server.stub.GenerateStream(request))
    together = list(server.stub.GenerateStream(coalesced(request)))
    assert token_fields(together) == token_fields(plain)
    assert len(token_fields(plain)) == NEW
    assert together[-1].done.token_ids == plain[-1].done.token_ids
    assert together[-1].done.text == plain[-1].done.text
    assert {e.WhichOneof("event") for e in plain[:-1]} == {"token"}  # one token each without the option
    assert {e.WhichOneof("event") for e in together[:-1]} == {"tokens"}
    assert all(e.tokens.tokens for e in together[:-1]), "a message never carries no token"


def test_the_tokens_of_one_decode_round_share_a_message(server: RunningServer) -> None:
    request = greedy_request(prompt_ids(30, seed=62), NEW)
    request.sampling.CopyFrom(pb.SamplingOptions(temperature=1.0, seed=5))
    request.n = 4
    events = list(server.stub.GenerateStream(coalesced(request)))
    done = events[-1].done
    messages = [tokens_of(e) for e in events[:-1]]
    assert sum(len(m) for m in messages) == 4 * NEW
    # A round decodes the four samples' rows in one forward and hands their tokens to the event loop
    # in one wake-up: they cannot arrive apart.
    assert len(messages) <= NEW
    for sample in range(4):
        mine = [t for m in messages for t in m if t.sample == sample]
        assert [t.index for t in mine] == list(range(NEW))
        assert [t.id for t in mine] == list(done.samples[sample].token_ids)


def test_each_coalesced_token_keeps_its_own_latency(server: RunningServer) -> None:
    events = list(server.stub.GenerateStream(coalesced(greedy_request(prompt_ids(20, seed=63), NEW))))
    tokens = [t for e in events for t in tokens_of(e)]
    done = events[-1].done
    assert tokens[0].latency_ms == pytest.approx(done.timing.ttft_ms, abs=1e-6)
    assert all(t.latency_ms > 0 for t in tokens)
    assert sum(t.latency_ms for t in tokens) <= done.timing.total_ms


def test_a_token_seen_with_later_ones_is_timed_from_the_one_before_it() -> None:
    progress = Progress(10.0, 5, PrefillTally(), Metrics())
    progress.samples = 1
    seen = [TokenOut(7, "a", 0, 10.5), TokenOut(8, "b", 1, 10.75), TokenOut(9, "c", 2, 11.0)]
    for event in seen:  # a batch: all seen before any is written
        progress.see(event)
    assert [progress.latency_ms(e) for e in seen] == [500.0, 250.0, 250.0]


def test_a_coalesced_decode_continues_a_session_as_a_plain_one_does(server: RunningServer) -> None:
    tokens = prompt_ids(50, seed=64)
    whole = list(server.stub.Generate(greedy_request(tokens, NEW)).token_ids)
    done = prefill(server, part(tokens, last=True))[-1].done
    events = list(
        server.stub.Decode(
            pb.DecodeRequest(
                session_id=done.session_id,
                coalesce_tokens=True,
                stopping=pb.StoppingOptions(max_new_tokens=NEW, ignore_eos=True),
            )
        )
    )
    assert [t.id for e in events for t in tokens_of(e)] == whole
    assert {e.WhichOneof("event") for e in events[:-1]} == {"tokens"}
    assert events[-1].done.session_length == len(tokens) + NEW
    server.stub.CloseSession(pb.CloseSessionRequest(session_id=done.session_id))


def test_generate_ignores_the_option(server: RunningServer) -> None:
    request = greedy_request(prompt_ids(30, seed=65), 8)
    assert server.stub.Generate(coalesced(request)).token_ids == server.stub.Generate(request).token_ids


def test_a_refused_coalesced_call_fails_as_a_plain_one(server: RunningServer) -> None:
    request = coalesced(greedy_request(prompt_ids(30, seed=66), 10**6))
    with pytest.raises(grpc.RpcError) as caught:
        list(server.stub.GenerateStream(request))
    assert caught.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert server.stats().sessions_open == 0
