"""Every bad input ends its own call with its own status, and the server keeps serving."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from proto.ladder.v1 import ladder_pb2 as pb
from tests.support.models import model_with_tokenizer
from tests.support.prompts import greedy_request
from tests.support.servers import RunningServer, server_config
from tests.support.waiting import wait_for

Code = grpc.StatusCode


def generate_status(server: RunningServer, request: pb.GenerateRequest) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as unary:
        server.stub.Generate(request)
    with pytest.raises(grpc.RpcError) as streamed:
        list(server.stub.GenerateStream(request))
    assert unary.value.code() == streamed.value.code()
    return unary.value.code()  # type: ignore[no-any-return]


def with_sampling(**values: object) -> pb.GenerateRequest:
    request = greedy_request([5, 6, 7], 4)
    request.sampling.CopyFrom(pb.SamplingOptions(**values))  # type: ignore[arg-type]
    return request


BAD_REQUESTS = {
    "no prompt": (pb.GenerateRequest(), Code.INVALID_ARGUMENT),
    "empty token list": (greedy_request([], 4), Code.INVALID_ARGUMENT),
    "empty text": (pb.GenerateRequest(prompt=pb.Prompt(text="")), Code.INVALID_ARGUMENT),
    "empty chat": (pb.GenerateRequest(prompt=pb.Prompt(chat=pb.Chat())), Code.INVALID_ARGUMENT),
    "token id at the vocabulary size": (greedy_request([5, 512], 4), Code.INVALID_ARGUMENT),
    "negative token id": (greedy_request([-1], 4), Code.INVALID_ARGUMENT),
    "negative temperature": (with_sampling(temperature=-0.5), Code.INVALID_ARGUMENT),
    "negative top_k": (with_sampling(top_k=-1), Code.INVALID_ARGUMENT),
    "top_p above one": (with_sampling(top_p=1.5), Code.INVALID_ARGUMENT),
    "top_p zero": (with_sampling(top_p=0.0), Code.INVALID_ARGUMENT),
    "zero repetition penalty": (with_sampling(repetition_penalty=0.0), Code.INVALID_ARGUMENT),
    "prompt over the capacity": (greedy_request([5] * 1025, 1), Code.OUT_OF_RANGE),
    "prompt plus new tokens over the capacity": (greedy_request([5] * 1000, 100), Code.OUT_OF_RANGE),
    "max_new_tokens over the server limit": (greedy_request([5], 257), Code.OUT_OF_RANGE),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_a_bad_generate_request_gets_its_status_and_the_server_keeps_serving(
    server: RunningServer, case: str
) -> None:
    request, code = BAD_REQUESTS[case]
    assert generate_status(server, request) == code
    assert len(server.stub.Generate(greedy_request([5, 6, 7], 3)).token_ids) == 3
    assert server.stats().sessions_open == 0


def test_unknown_and_malformed_sessions_are_not_found(server: RunningServer) -> None:
    for session_id in ("pod-a.nope", "", "garbage"):
        with pytest.raises(grpc.RpcError) as caught:
            server.stub.Rewind(pb.RewindRequest(session_id=session_id, length=0))
        assert caught.value.code() == Code.NOT_FOUND
        with pytest.raises(grpc.RpcError) as caught:
            list(server.stub.Decode(pb.DecodeRequest(session_id=session_id)))
        assert caught.value.code() == Code.NOT_FOUND


def test_a_session_of_another_pod_is_refused_with_its_owner_in_the_trailers(server: RunningServer) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        server.stub.CloseSession(pb.CloseSessionRequest(session_id="pod-b.abcdefghijklmnopqrstuv"))
    assert caught.value.code() == Code.FAILED_PRECONDITION
    assert "pod-b" in caught.value.details()
    assert ("ladder-session-owner", "pod-b") in tuple(caught.value.trailing_metadata())


def test_a_prefill_with_no_messages_is_invalid(server: RunningServer) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        list(server.stub.Prefill(iter([])))
    assert caught.value.code() == Code.INVALID_ARGUMENT


def test_text_needs_a_tokenizer_and_says_so(tmp_path: Path) -> None:
    path = model_with_tokenizer(tmp_path)
    (path / "tokenizer.json").unlink()
    running = RunningServer(server_config(path))
    try:
        assert (
            generate_status(running, pb.GenerateRequest(prompt=pb.Prompt(text="hi")))
            == Code.FAILED_PRECONDITION
        )
        assert len(running.stub.Generate(greedy_request([5, 6], 2)).token_ids) == 2
    finally:
        running.close()


def test_a_request_waits_for_a_free_slot_and_only_a_full_queue_is_resource_exhausted(
    served_model: Path,
) -> None:
    running = RunningServer(
        server_config(served_model, max_sessions=1, max_queue=1, session_memory_mb=0)
    )  # a session holds its slot
    try:
        first = pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=[5])))
        opened = list(running.stub.Prefill(iter([first])))[-1].done.session_id
        # Every slot is taken: the request waits in the queue until its deadline.
        with pytest.raises(grpc.RpcError) as waited:
            running.stub.Generate(greedy_request([5, 6], 2), timeout=0.3)
        assert waited.value.code() == Code.DEADLINE_EXCEEDED
        wait_for(lambda: running.stats().queue_depth == 0)  # the expired request left the queue
        # A waiting request holds the only queue place: the next one is refused at once.
        waiting = running.stub.Generate.future(greedy_request([5, 6], 2))
        wait_for(lambda: running.stats().waiting_for_slot == 1)
        assert generate_status(running, greedy_request([5, 6], 2)) == Code.RESOURCE_EXHAUSTED
        # The slot frees: the waiting request runs to the end.
        running.stub.CloseSession(pb.CloseSessionRequest(session_id=opened))
        assert len(waiting.result(timeout=30).token_ids) == 2
        assert running.stats().sessions_open == 0
    finally:
        running.close()


def test_the_memory_budget_sizes_the_slot_pool_and_stats_show_the_budget(tmp_path: Path) -> None:
    # KV large enough (8 layers x 4 KV heads x 32 x 1024 positions: 8 MiB a session) to budget in MiB.
    served_model = model_with_tokenizer(tmp_path, num_layers=8, num_heads=4, num_kv_heads=4, head_size=32)
    probe = RunningServer(server_config(served_model, max_sessions=4, session_memory_mb=0))
    try:
        unbudgeted = probe.stats()
    finally:
        probe.close()
    slot = unbudgeted.slot_bytes
    assert unbudgeted.slots_allocated == 4 and unbudgeted.memory.kv_bytes == 4 * slot
    # Budget: the weights, the variant reserve and one and a half sessions' KV: one slot fits.
    budget_mb = (unbudgeted.memory.weights_bytes + (3 * slot) // 2 + (1 << 20)) >> 20
    running = RunningServer(
        server_config(served_model, max_sessions=4, memory_budget_mb=budget_mb, session_memory_mb=0)
    )
    try:
        prefill = pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=[5, 6, 7])))
        opened = list(running.stub.Prefill(iter([prefill])))[-1].done
        with pytest.raises(grpc.RpcError) as waited:  # the one slot is taken: a request waits
            running.stub.Generate(greedy_request([5, 6], 2), timeout=0.3)
        assert waited.value.code() == Code.DEADLINE_EXCEEDED
        stats = running.stats()
        assert stats.slots_allocated == 1 and stats.memory.kv_bytes == slot
        assert stats.memory.budget_bytes == budget_mb << 20
        assert stats.memory.total_bytes <= stats.memory.budget_bytes
        assert [e.width for e in stats.variants.held] and all(e.bytes > 0 for e in stats.variants.held)
        running.stub.CloseSession(pb.CloseSessionRequest(session_id=opened.session_id))
        assert len(running.stub.Generate(greedy_request([5, 6], 2)).token_ids) == 2
    finally:
        running.close()
