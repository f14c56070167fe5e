"""A stateful session's penalties carry across Decode calls: presence and frequency penalties
count every token a Decode chose that the session still holds, so Decode(n) + Decode(m) =
Decode(n + m); a Rewind forgets the tokens it drops, a fork keeps the ones it holds. On the
default model (int4), whose greedy replies repeat tokens, so the penalties change them; the
sessions compared hold bit copies of the same rows (full-length forks), as a Rewind into a reply
recomputes rows a Decode wrote (docs/api.md, exactness) and could part on a near tie."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from proto.ladder.v1 import ladder_pb2 as pb
from tests.support.servers import RunningServer, server_config
from tests.support.sessions import part, prefill

PENALTIES = pb.SamplingOptions(frequency_penalty=0.8, presence_penalty=0.4)
PROMPTS = ("The capital of France is", "List the days of the week:", "def fibonacci(n):")


@pytest.fixture(scope="module")
def server(default_model: Callable[..., Path]) -> Iterator[RunningServer]:
    with RunningServer(server_config(default_model("int4"), max_sessions=4, capacity=1024)) as running:
        yield running


def decode(
    server: RunningServer, session_id: str, n: int, sampling: pb.SamplingOptions = PENALTIES
) -> list[int]:
    stopping = pb.StoppingOptions(max_new_tokens=n, ignore_eos=True)
    request = pb.DecodeRequest(session_id=session_id, sampling=sampling, stopping=stopping)
    return [e.token.id for e in server.stub.Decode(request) if e.HasField("token")]


def opened(server: RunningServer, ids: list[int]) -> str:
    return prefill(server, part(ids, last=True))[-1].done.session_id


def ids_of(server: RunningServer, text: str) -> list[int]:
    return list(server.stub.Tokenize(pb.TokenizeRequest(text=text)).ids)


def fork(server: RunningServer, session_id: str) -> str:
    """A full-length fork: a bit copy of the session's rows and logits."""
    return server.stub.ForkSession(pb.ForkSessionRequest(session_id=session_id)).session_id


def close(server: RunningServer, *session_ids: str) -> None:
    for session_id in session_ids:
        server.stub.CloseSession(pb.CloseSessionRequest(session_id=session_id))


def test_decode_n_then_m_equals_decode_n_plus_m_with_penalties(server: RunningServer) -> None:
    for text in PROMPTS:
        whole = opened(server, ids_of(server, text))
        parts = fork(server, whole)
        at_once = decode(server, whole, 24)
        in_parts = decode(server, parts, 6) + decode(server, parts, 8) + decode(server, parts, 10)
        assert in_parts == at_once, text
        close(server, whole, parts)


def test_a_seeded_decode_in_parts_draws_what_one_decode_draws(server: RunningServer) -> None:
    """Draws are keyed by the seed and counted by position (docs/api.md, Seeds): no generator state
    starts over with each call."""
    seeded = pb.SamplingOptions(temperature=1.1, top_p=0.95, seed=5, frequency_penalty=0.3)
    for text in PROMPTS:
        whole = opened(server, ids_of(server, text))
        parts = fork(server, whole)
        at_once = decode(server, whole, 24, seeded)
        in_parts = [t for n in (6, 8, 10) for t in decode(server, parts, n, seeded)]
        assert in_parts == at_once, text
        close(server, whole, parts)
    greedy = opened(server, ids_of(server, PROMPTS[-1]))
    assert decode(server, greedy, 24, pb.SamplingOptions(frequency_penalty=0.3)) != at_once, "it samples"
    close(server, greedy)


def test_a_rewind_forgets_the_penalties_of_the_tokens_it_drops(server: RunningServer) -> None:
    prompt = ids_of(server, PROMPTS[1])
    session_id = opened(server, prompt)
    first = decode(server, session_id, 12)
    decode(server, session_id, 12)
    server.stub.Rewind(pb.RewindRequest(session_id=session_id, length=len(prompt)))
    assert decode(server, session_id, 12) == first, "24 counted tokens would have changed it"
    close(server, session_id)


def test_a_fork_keeps_the_penalties_of_the_tokens_it_holds(server: RunningServer) -> None:
    source = opened(server, ids_of(server, PROMPTS[2]))
    twin = fork(server, source)
    first = decode(server, source, 20)
    assert decode(server, twin, 9) == first[:9]
    copy = fork(server, twin)  # holds the 9 tokens the twin's Decode chose
    assert decode(server, copy, 11) == first[9:20]
    close(server, source, twin, copy)
