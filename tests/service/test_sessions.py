"""Server-side sessions: Prefill and Decode over separate calls, Rewind, Close, cancel and expiry."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import grpc
import pytest

from proto.ladder.v1 import ladder_pb2 as pb
from tests.support.prompts import greedy_request, prompt_ids
from tests.support.servers import RunningServer, server_config
from tests.support.sessions import decode, held_open, part, prefill
from tests.support.waiting import wait_for

DEADLINE_S = 2.0  # ample to reach the first token on a loaded machine; it passes while the worker is held


def test_prefill_streams_one_event_per_forward_and_ends_with_the_session(server: RunningServer) -> None:
    tokens = prompt_ids(150, seed=20)
    events = prefill(server, part(tokens))
    forwards = [e.forward for e in events if e.HasField("forward")]
    done = events[-1].done
    assert [(f.past, f.real_rows) for f in forwards] == [(0, 64), (64, 64), (128, 22)]
    assert all(f.width >= f.real_rows for f in forwards)
    assert done.length == 150 and done.session_id.startswith("pod-a.")
    assert done.summary.forwards == 3 and done.summary.real_rows == 150
    assert done.next_token == server.stub.Generate(greedy_request(tokens, 1)).token_ids[0]
    server.stub.CloseSession(pb.CloseSessionRequest(session_id=done.session_id))


def test_prefill_then_decode_over_two_calls_equals_one_generate(server: RunningServer) -> None:
    tokens = prompt_ids(130, seed=21)
    done = prefill(server, part(tokens[:70]), part(tokens[70:]))[-1].done
    assert done.length == 130
    ids, completion = decode(server, done.session_id, 12)
    assert ids == list(server.stub.Generate(greedy_request(tokens, 12)).token_ids)
    assert completion.session_length == 142
    more, _ = decode(server, done.session_id, 4)
    assert ids + more == list(server.stub.Generate(greedy_request(tokens, 16)).token_ids)
    server.stub.CloseSession(pb.CloseSessionRequest(session_id=done.session_id))


def test_rewind_then_decode_reproduces_the_earlier_continuation(server: RunningServer) -> None:
    tokens = prompt_ids(90, seed=22)
    session_id = prefill(server, part(tokens))[-1].done.session_id
    first, _ = decode(server, session_id, 10)
    assert server.stub.Rewind(pb.RewindRequest(session_id=session_id, length=90)).length == 90
    again, _ = decode(server, session_id, 10)
    assert again == first
    server.stub.Rewind(pb.RewindRequest(session_id=session_id, length=60))
    extended = prefill(server, part(tokens[60:], session_id))[-1].done
    assert extended.session_id == session_id and extended.length == 90
    assert decode(server, session_id, 10)[0] == first
    server.stub.CloseSession(pb.CloseSessionRequest(session_id=session_id))


def test_a_closed_session_returns_its_kv_slot_and_is_gone(server: RunningServer) -> None:
    before = server.stats().sessions_open
    session_id = prefill(server, part([5, 6, 7]))[-1].done.session_id
    assert server.stats().sessions_open == before + 1
    assert server.stub.CloseSession(pb.CloseSessionRequest(session_id=session_id)).length == 3
    assert server.stats().sessions_open == before
    with pytest.raises(grpc.RpcError) as caught:
        decode(server, session_id, 1)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_cancelling_a_stream_mid_decode_frees_its_session(server: RunningServer) -> None:
    stream = server.stub.GenerateStream(greedy_request(prompt_ids(50, seed=23), 250))
    next(stream)
    next(stream)
    assert server.stats().sessions_open == 1
    stream.cancel()
    wait_for(lambda: server.stats().sessions_open == 0)


def test_a_deadline_passing_mid_decode_frees_its_session(server: RunningServer) -> None:
    stream = server.stub.GenerateStream(greedy_request(prompt_ids(50, seed=24), 250), timeout=DEADLINE_S)
    next(stream)  # decoding; the worker is then held, so the deadline passes mid-decode on any machine
    with server.frozen(), pytest.raises(grpc.RpcError) as caught:
        for _ in stream:
            pass
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    wait_for(lambda: server.stats().sessions_open == 0)


def test_cancelling_a_prefill_that_opened_a_session_closes_it(server: RunningServer) -> None:
    cancelled = threading.Event()

    def parts() -> object:
        yield part(prompt_ids(100, seed=25))
        cancelled.wait(30)  # the client never finishes its prompt; released once the call is cancelled

    stream = server.stub.Prefill(parts())
    first = next(stream)
    assert first.forward.session_id
    stream.cancel()
    cancelled.set()
    wait_for(lambda: server.stats().sessions_open == 0)


def test_an_idle_session_expires_and_returns_its_slot(served_model: Path) -> None:
    running = RunningServer(server_config(served_model, session_idle_seconds=0.2))
    requests, release = held_open(part([5, 6, 7]))
    try:
        stream = running.stub.Prefill(requests)
        session_id = next(stream).forward.session_id
        # The Prefill is still open (its prompt may go on), so the session is in use and cannot
        # expire, however long this check takes on a loaded machine.
        assert running.stats().sessions_open == 1
        release.set()  # the prompt ends: the session is released, and idles from here
        assert [e for e in stream if e.HasField("done")][-1].done.session_id == session_id
        wait_for(lambda: running.stats().sessions_open == 0, what="the idle session to expire")
        with pytest.raises(grpc.RpcError) as caught:
            decode(running, session_id, 1)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        release.set()
        running.close()


def test_a_decode_cancelled_mid_stream_leaves_its_session_consistent(server: RunningServer) -> None:
    tokens = prompt_ids(40, seed=26)
    full = list(server.stub.Generate(greedy_request(tokens, 200)).token_ids)
    session_id = prefill(server, part(tokens))[-1].done.session_id
    stream = server.stub.Decode(
        pb.DecodeRequest(
            session_id=session_id, stopping=pb.StoppingOptions(max_new_tokens=180, ignore_eos=True)
        )
    )
    for _ in range(5):
        next(stream)
    stream.cancel()
    for _ in range(6000):  # the session is busy until the worker has ended the cancelled job (bound: 60 s)
        try:
            more, done = decode(server, session_id, 3)
            break
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.ABORTED
            time.sleep(0.01)
    else:
        pytest.fail("the cancelled Decode never let go of its session")
    held = done.session_length - 3 - len(tokens)
    assert 5 <= held <= 180 and more == full[held : held + 3]
    server.stub.CloseSession(pb.CloseSessionRequest(session_id=session_id))


def test_a_client_acting_on_done_before_the_status_finds_its_session_free(server: RunningServer) -> None:
    # A client may act on the final event at once, without reading the call's status first
    # (grpc-js and grpcurl users do); the session must already be released and kept by then.
    for round_ in range(15):
        stream = server.stub.Prefill(iter([part(prompt_ids(30, seed=round_), last=True)]))
        done = next(e for e in stream if e.HasField("done")).done
        stream.cancel()
        decoding = server.stub.Decode(
            pb.DecodeRequest(
                session_id=done.session_id, stopping=pb.StoppingOptions(max_new_tokens=3, ignore_eos=True)
            )
        )
        next(e for e in decoding if e.HasField("done"))
        response = server.stub.Rewind(pb.RewindRequest(session_id=done.session_id, length=30))
        decoding.cancel()
        assert response.length == 30
        server.stub.CloseSession(pb.CloseSessionRequest(session_id=done.session_id))


def test_a_message_marked_last_ends_the_prompt_without_the_client_closing_its_side(
    server: RunningServer,
) -> None:
    first, second = prompt_ids(40, seed=51), prompt_ids(30, seed=52)
    ends = ([part(first), part(second, last=True)], [part(first), part(second), pb.PrefillRequest(last=True)])
    for messages in ends:
        requests, release = held_open(*messages)
        stream = server.stub.Prefill(requests)
        try:
            done = next(e for e in stream if e.HasField("done")).done
        finally:
            release.set()
        assert done.length == 70
        assert done.next_token == server.stub.Generate(greedy_request(first + second, 1)).token_ids[0]
        # Released before "done" was sent: a call acting on it at once is not ABORTED.
        tokens, completion = decode(server, done.session_id, 3)
        assert completion.session_length == 73
        server.stub.CloseSession(pb.CloseSessionRequest(session_id=done.session_id))
