"""Exact on the model users serve, through a real server: the default model in int4.

Rewind to the prompt, a shorter ForkSession, a prompt sent with a one-token last Prefill part and
a 1,025-token prompt sent twice (the second over its held prefix) each give the greedy tokens of a
fresh Generate; Generates racing over prefixes held by sessions that decoded and rewound give the
tokens of a server with sharing off.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from proto.ladder.v1 import ladder_pb2 as pb
from tests.support.prompts import greedy_request
from tests.support.servers import RunningServer, server_config
from tests.support.sessions import decode, part, prefill

PROMPTS = (
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at a temperature of",
    "My favourite book is",
    "In 1969, the first man to walk on the moon was",
    "The quick brown fox",
    "import numpy as np\n",
    "The best way to learn a language is",
)
NEW = 8


@pytest.fixture(scope="module")
def model_dir(default_model: Callable[..., Path]) -> Path:
    return default_model("int4")


@pytest.fixture(scope="module")
def server(model_dir: Path) -> Iterator[RunningServer]:
    with RunningServer(server_config(model_dir, max_sessions=8, capacity=2048)) as running:
        yield running


def tokenize(server: RunningServer, text: str) -> list[int]:
    return list(server.stub.Tokenize(pb.TokenizeRequest(text=text)).ids)


def generate(server: RunningServer, ids: list[int], new: int = NEW) -> list[int]:
    return list(server.stub.Generate(greedy_request(ids, new)).token_ids)


def opened(server: RunningServer, *parts: pb.PrefillRequest) -> str:
    return prefill(server, *parts)[-1].done.session_id


def close(server: RunningServer, session_id: str) -> None:
    server.stub.CloseSession(pb.CloseSessionRequest(session_id=session_id))


@pytest.mark.parametrize("text", PROMPTS)
def test_session_paths_give_a_fresh_runs_greedy_tokens(server: RunningServer, text: str) -> None:
    ids = tokenize(server, text)
    fresh = generate(server, ids)
    session = opened(server, part(ids, last=True))
    first, _ = decode(server, session, NEW)
    server.stub.Rewind(pb.RewindRequest(session_id=session, length=len(ids)))
    again, _ = decode(server, session, NEW)
    fork = server.stub.ForkSession(pb.ForkSessionRequest(session_id=session, length=len(ids))).session_id
    forked, _ = decode(server, fork, NEW)
    parts = opened(server, part(ids[:-1]), part(ids[-1:], last=True))
    in_parts, _ = decode(server, parts, NEW)
    for s in (session, fork, parts):
        close(server, s)
    assert (first, again, forked, in_parts) == (fresh, fresh, fresh, fresh)


def test_a_long_prompt_sent_twice_gives_the_same_tokens(server: RunningServer) -> None:
    text = "".join(f"Entry {i}: the ladder has three widths, and a chunk has 512 rows.\n" for i in range(90))
    ids = tokenize(server, text)[:1025]
    assert len(ids) == 1025
    first = server.stub.Generate(greedy_request(ids, NEW))
    second = server.stub.Generate(greedy_request(ids, NEW))
    assert second.usage.prompt_tokens == 1025
    assert list(second.token_ids) == list(first.token_ids)
    assert server.stats().prefix.hits >= 1


def test_requests_racing_over_prefixes_of_decoded_and_rewound_sessions_match_a_server_without_sharing(
    model_dir: Path, server: RunningServer
) -> None:
    system = tokenize(server, "".join(f"Rule {i}: answer briefly and exactly.\n" for i in range(40)))
    turns = [tokenize(server, f" Question {i}: what is {i} plus {i}?") for i in range(16)]
    holders = []
    for turn in turns[:4]:  # sessions that hold the system prompt, decoded past it and rewound into it
        session = opened(server, part(system + turn, last=True))
        decode(server, session, 12)
        server.stub.Rewind(pb.RewindRequest(session_id=session, length=len(system) + 3))
        decode(server, session, 6)
        holders.append(session)
    hits = server.stats().prefix.hits
    with ThreadPoolExecutor(8) as pool:
        shared = list(pool.map(lambda t: generate(server, system + t), turns))
    assert server.stats().prefix.hits > hits
    for session in holders:
        close(server, session)
    config = server_config(model_dir, max_sessions=8, capacity=2048, prefix_sharing=False)
    with RunningServer(config) as plain:
        unshared = [generate(plain, system + t) for t in turns]
    assert shared == unshared
