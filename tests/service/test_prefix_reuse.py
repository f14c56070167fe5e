"""ForkSession and automatic prefix sharing through a real server (generated decoder, chunk width 64:
prefixes are found in whole ladder steps of 22, then shared to the last token a prompt repeats).

Greedy tokens of a forked or prefix-sharing call equal those of a server with
sharing off that prefilled the whole prompt; auth keeps callers' prefixes apart.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client import generate_latest

from proto.ladder.v1 import ladder_pb2 as pb
from tests.support.prompts import common_prefix, greedy_request, prompt_ids
from tests.support.servers import RunningServer, server_config

TOKENS = ("alice=token-a", "bob=token-b")
SYSTEM = prompt_ids(150, seed=77)  # six whole units (132 tokens) and then some


def bearer(name: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer token-{name[0]}"),)


def ids(tokens: list[int]) -> pb.Prompt:
    return pb.Prompt(tokens=pb.TokenIds(ids=tokens))


def open_session(running: RunningServer, tokens: list[int], caller: str = "") -> pb.PrefillDone:
    metadata = bearer(caller) if caller else ()
    events = list(running.stub.Prefill(iter([pb.PrefillRequest(prompt=ids(tokens))]), metadata=metadata))
    return events[-1].done


def decode(running: RunningServer, session_id: str, n: int) -> list[int]:
    request = pb.DecodeRequest(
        session_id=session_id, stopping=pb.StoppingOptions(max_new_tokens=n, ignore_eos=True)
    )
    return [e.token.id for e in running.stub.Decode(request) if e.HasField("token")]


def fork(running: RunningServer, session_id: str, length: int | None = None) -> pb.ForkSessionResponse:
    request = pb.ForkSessionRequest(session_id=session_id)
    if length is not None:
        request.length = length
    return running.stub.ForkSession(request)


def refused(call: Callable[[], object]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value.code()  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def unshared(served_model: Path) -> Iterator[RunningServer]:
    running = RunningServer(server_config(served_model, prefix_sharing=False))
    yield running
    running.close()


def generated(running: RunningServer, tokens: list[int], n: int = 12) -> list[int]:
    return list(running.stub.Generate(greedy_request(tokens, n)).token_ids)


def test_a_forked_session_decodes_what_the_source_and_a_full_prefill_decode(
    server: RunningServer, unshared: RunningServer
) -> None:
    source = open_session(server, SYSTEM)
    forked = fork(server, source.session_id)
    assert (forked.length, forked.source_session_id) == (150, source.session_id)
    assert forked.session_id != source.session_id and forked.server_ms > 0
    expected = generated(unshared, SYSTEM)
    assert decode(server, forked.session_id, 12) == expected
    assert decode(server, source.session_id, 12) == expected
    shorter = fork(server, source.session_id, 90)
    assert shorter.length == 90
    assert decode(server, shorter.session_id, 10) == generated(unshared, SYSTEM[:90], 10)
    for session_id in (source.session_id, forked.session_id, shorter.session_id):
        server.stub.CloseSession(pb.CloseSessionRequest(session_id=session_id))
    assert server.stats().sessions_open == 0


def test_fork_errors_have_their_codes_and_take_no_slot(served_model: Path) -> None:
    running = RunningServer(
        server_config(served_model, max_sessions=2, sessions_per_caller=8, session_memory_mb=0)
    )
    try:
        source = open_session(running, SYSTEM[:20]).session_id
        assert refused(lambda: fork(running, "pod-a.nosuchsession")) == grpc.StatusCode.NOT_FOUND
        assert refused(lambda: fork(running, source, 21)) == grpc.StatusCode.INVALID_ARGUMENT
        fork(running, source)
        assert refused(lambda: fork(running, source)) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert running.stats().sessions_open == 2
    finally:
        running.close()


def test_a_fork_counts_toward_the_callers_share(served_model: Path) -> None:
    running = RunningServer(
        server_config(served_model, max_sessions=3, auth_tokens=TOKENS, session_memory_mb=0)
    )
    try:
        source = open_session(running, SYSTEM[:20], "alice").session_id
        request = pb.ForkSessionRequest(session_id=source)
        running.stub.ForkSession(request, metadata=bearer("alice"))
        code = refused(lambda: running.stub.ForkSession(request, metadata=bearer("alice")))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED  # alice holds 2 of 3: her share
        assert (
            refused(lambda: running.stub.ForkSession(request, metadata=bearer("bob")))
            == grpc.StatusCode.NOT_FOUND
        )  # another caller's session does not exist for bob
    finally:
        running.close()


def test_generate_calls_sharing_a_prefix_give_the_tokens_of_a_full_prefill(
    server: RunningServer, unshared: RunningServer
) -> None:
    first, second = SYSTEM + prompt_ids(20, seed=1), SYSTEM + prompt_ids(30, seed=2)
    before = server.stats().prefix
    server.stub.Generate(greedy_request(first, 4))
    reply = server.stub.Generate(greedy_request(second, 12))
    shared = common_prefix(first, second)  # past the last whole unit (132) to the last repeated token
    assert shared >= 150 and reply.prefill.shared_rows == shared and reply.usage.prompt_tokens == 180
    assert reply.prefill.real_rows == 180 - shared  # only the rest was prefilled
    assert list(reply.token_ids) == generated(unshared, second)
    events = server.stub.GenerateStream(greedy_request(second, 12))
    streamed = [e.token.id for e in events if e.HasField("token")]
    assert streamed == list(reply.token_ids)
    after = server.stats().prefix
    assert after.hits - before.hits >= 2 and after.tokens_saved - before.tokens_saved >= 2 * shared
    assert after.slots_held >= 1 and after.bytes_held > 0
    assert server.stats().sessions_open == 0


def test_a_new_sessions_first_prefill_starts_from_a_held_prefix(
    server: RunningServer, unshared: RunningServer
) -> None:
    tokens = SYSTEM + prompt_ids(10, seed=3)
    server.stub.Generate(greedy_request(SYSTEM + prompt_ids(5, seed=4), 2))
    events = list(server.stub.Prefill(iter([pb.PrefillRequest(prompt=ids(tokens))])))
    shared = common_prefix(tokens, SYSTEM + prompt_ids(5, seed=4))
    assert shared >= 150 and events[0].forward.past == events[-1].done.summary.shared_rows == shared
    session_id = events[-1].done.session_id
    assert decode(server, session_id, 10) == generated(unshared, tokens, 10)
    server.stub.CloseSession(pb.CloseSessionRequest(session_id=session_id))


def test_with_auth_on_a_prefix_is_never_shared_across_callers_unless_allowed(served_model: Path) -> None:
    for across in (False, True):
        running = RunningServer(server_config(served_model, auth_tokens=TOKENS, prefix_across_callers=across))
        try:
            alice = running.stub.Generate(greedy_request(SYSTEM + [5, 5], 2), metadata=bearer("alice"))
            bob = running.stub.Generate(greedy_request(SYSTEM + [6, 6], 2), metadata=bearer("bob"))
            again = running.stub.Generate(greedy_request(SYSTEM + [7, 7], 2), metadata=bearer("alice"))
            assert alice.prefill.shared_rows == 0 and again.prefill.shared_rows == 150
            assert bob.prefill.shared_rows == (150 if across else 0)
        finally:
            running.close()


def test_sharing_off_shares_nothing_and_prefix_metrics_are_exported(
    server: RunningServer, unshared: RunningServer
) -> None:
    unshared.stub.Generate(greedy_request(SYSTEM + [1], 2))
    reply = unshared.stub.Generate(greedy_request(SYSTEM + [2], 2))
    assert reply.prefill.shared_rows == 0
    stats = unshared.stats().prefix
    assert (stats.enabled, stats.hits, stats.slots_held) == (False, 0, 0)
    server.stats()  # refreshes the gauges
    text = generate_latest(server.server.metrics.registry).decode()
    assert "ladder_prefix_hits_total" in text and "ladder_prefix_bytes_held" in text
