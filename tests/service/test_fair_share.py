"""Fair share of the KV slots where sessions hold them (--session-memory-mb 0: no parking): no caller can
hold them all by default, and waiting counts as holding. With parking (the default) memory bounds sessions."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from proto.ladder.v1 import ladder_pb2 as pb
from service.config import Config
from tests.support.prompts import greedy_request
from tests.support.servers import RunningServer, server_config
from tests.support.waiting import wait_for

TOKENS = ("alice=token-a", "bob=token-b", "carol=token-c")


def slotted(served_model: Path, **settings: Any) -> Config:
    """A server whose sessions hold their KV slots (no parking)."""
    return server_config(served_model, session_memory_mb=0, **settings)


def bearer(name: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer token-{name[0]}"),)


def prefill(running: RunningServer, caller: str) -> Iterator[pb.PrefillEvent]:
    part = pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=[5, 6, 7])))
    return running.stub.Prefill(iter([part]), metadata=bearer(caller), timeout=30)  # type: ignore[no-any-return]


def open_session(running: RunningServer, caller: str) -> str:
    return list(prefill(running, caller))[-1].done.session_id  # type: ignore[no-any-return]


def close(running: RunningServer, caller: str, session_id: str) -> None:
    running.stub.CloseSession(pb.CloseSessionRequest(session_id=session_id), metadata=bearer(caller))


def stats(running: RunningServer) -> pb.EngineStats:
    return running.stub.GetEngineStats(pb.GetEngineStatsRequest(), metadata=bearer("alice"))


def refused(call: Callable[[], object]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value.code()  # type: ignore[no-any-return]


def test_by_default_a_caller_holds_every_slot_but_one_and_another_caller_still_gets_one(
    served_model: Path,
) -> None:
    running = RunningServer(slotted(served_model, max_sessions=3, auth_tokens=TOKENS))
    try:
        held = [open_session(running, "alice") for _ in range(2)]
        assert refused(lambda: open_session(running, "alice")) == grpc.StatusCode.RESOURCE_EXHAUSTED
        other = open_session(running, "bob")  # the slot the share kept free
        assert stats(running).sessions_open == 3
        for session_id in held:
            close(running, "alice", session_id)
        close(running, "bob", other)
        assert open_session(running, "alice")  # a closed session gives its share back
    finally:
        running.close()


def test_sessions_a_caller_waits_for_count_toward_its_share(served_model: Path) -> None:
    running = RunningServer(slotted(served_model, max_sessions=3, auth_tokens=TOKENS))
    try:
        bobs = [open_session(running, "bob") for _ in range(2)]
        carols = open_session(running, "carol")  # every slot is taken
        waiting = [prefill(running, "alice") for _ in range(2)]
        wait_for(lambda: stats(running).waiting_for_slot == 2)
        # Alice holds nothing yet, but waits for her whole share: a third Prefill is refused at once.
        assert refused(lambda: open_session(running, "alice")) == grpc.StatusCode.RESOURCE_EXHAUSTED
        close(running, "bob", bobs[0])
        close(running, "carol", carols)
        alices = [list(stream)[-1].done.session_id for stream in waiting]
        assert stats(running).sessions_open == 3
        for session_id in alices:
            close(running, "alice", session_id)
        close(running, "bob", bobs[1])
    finally:
        running.close()


def test_a_caller_without_a_token_is_one_caller_and_generate_still_runs_beside_its_share(
    served_model: Path,
) -> None:
    running = RunningServer(slotted(served_model, max_sessions=2))
    try:
        session_id = open_session(running, "anyone")
        assert refused(lambda: open_session(running, "anyone")) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert len(running.stub.Generate(greedy_request([5, 6], 2), timeout=30).token_ids) == 2
        close(running, "anyone", session_id)
    finally:
        running.close()


def test_a_configured_share_lets_one_caller_take_every_slot(served_model: Path) -> None:
    running = RunningServer(slotted(served_model, max_sessions=3, sessions_per_caller=3))
    try:
        held = [open_session(running, "anyone") for _ in range(3)]
        assert stats(running).sessions_open == 3
        for session_id in held:
            close(running, "anyone", session_id)
    finally:
        running.close()


def test_n_samples_hold_no_more_than_the_caller_s_share_and_need_two_slots_of_it(served_model: Path) -> None:
    config = slotted(served_model, max_sessions=8, sessions_per_caller=4, auth_tokens=TOKENS)
    with RunningServer(config) as running:
        held = [open_session(running, "alice") for _ in range(2)]
        running.scheduler.steps.clear()
        request = greedy_request([5, 6, 7], 3)
        request.n = 10
        with running.frozen():
            tens = running.stub.Generate.future(request, metadata=bearer("alice"), timeout=60)
            wait_for(lambda: running.scheduler.depth == 1, what="the n = 10 request is queued")
        assert len(tens.result().samples) == 10
        # Beside Alice's two sessions her share leaves two slots: the prompt's holder and one sample
        # at a time (the last two, the holder's own among them, together), on two pool rows.
        decoded = [record.decode for record in running.scheduler.steps if record.decode]
        assert sum(len(rows) for rows in decoded) == 10 * 2
        assert len({row for rows in decoded for _, row in rows}) == 2
        held.append(open_session(running, "alice"))  # three of four: no room for a prompt and a sample
        with pytest.raises(grpc.RpcError) as caught:
            running.stub.Generate(request, metadata=bearer("alice"), timeout=30)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "2 KV slots" in (caught.value.details() or "")
        for session_id in held:
            close(running, "alice", session_id)
