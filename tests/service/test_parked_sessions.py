"""Sessions beyond slots through a real server (--session-memory-mb, on by default): more sessions
stay open than the server has KV slots, idle ones park off their slot, and each continues, in any
order, with the greedy tokens a fresh run of its prompt gives; past the memory budget new sessions
are refused, parked bytes never pass it, closing any session makes room, and with callers told
apart none can take the whole budget.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client import generate_latest

from proto.ladder.v1 import ladder_pb2 as pb
from service.limits import host_memory_free_bytes
from tests.support.prompts import greedy_request, prompt_ids
from tests.support.servers import RunningServer, server_config

SESSIONS = 7
SLOTS = 2


@pytest.fixture(scope="module")
def parking(served_model: Path) -> Iterator[RunningServer]:
    with RunningServer(server_config(served_model, max_sessions=SLOTS, session_memory_mb=64)) as running:
        yield running


def prefill(running: RunningServer, tokens: list[int]) -> str:
    request = pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=tokens)))
    return list(running.stub.Prefill(iter([request])))[-1].done.session_id


def decode(running: RunningServer, session_id: str, n: int) -> list[int]:
    request = pb.DecodeRequest(
        session_id=session_id, stopping=pb.StoppingOptions(max_new_tokens=n, ignore_eos=True)
    )
    return [e.token.id for e in running.stub.Decode(request) if e.HasField("token")]


def metric(running: RunningServer, name: str) -> float:
    running.stub.GetEngineStats(pb.GetEngineStatsRequest())  # refreshes the engine's counters
    text = generate_latest(running.server.metrics.registry).decode()
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert found, f"{name} not exported"
    return float(found.group(1))


def test_more_sessions_than_slots_stay_open_and_each_continues_as_a_fresh_run(parking: RunningServer) -> None:
    prompts = [prompt_ids(40 + 9 * i, seed=300 + i) for i in range(SESSIONS)]
    fresh = [
        [e.token.id for e in parking.stub.GenerateStream(greedy_request(p, 6)) if e.HasField("token")]
        for p in prompts
    ]
    ids = [prefill(parking, p) for p in prompts]  # seven sessions on two slots: five park
    assert metric(parking, "ladder_sessions_parked") >= SESSIONS - SLOTS
    stats = parking.stub.GetEngineStats(pb.GetEngineStatsRequest())
    assert stats.parking.enabled and stats.sessions_open == SESSIONS
    assert stats.parking.sessions_parked >= SESSIONS - SLOTS and stats.parking.parked_bytes > 0
    for i in np.random.default_rng(1).permutation(SESSIONS):
        assert decode(parking, ids[i], 3) == fresh[i][:3]
    for i in np.random.default_rng(2).permutation(SESSIONS):  # and again, after more moves
        assert decode(parking, ids[i], 3) == fresh[i][3:]
    assert metric(parking, "ladder_unparks_total") >= SESSIONS
    moves = parking.stub.GetEngineStats(pb.GetEngineStatsRequest()).parking
    assert moves.unparks >= SESSIONS and moves.unpark_seconds > 0
    for session_id in ids:
        parking.stub.CloseSession(pb.CloseSessionRequest(session_id=session_id))
    assert metric(parking, "ladder_parked_bytes") == 0


def test_a_generate_beside_parked_sessions_gets_its_slots(parking: RunningServer) -> None:
    ids = [prefill(parking, prompt_ids(30, seed=400 + i)) for i in range(SESSIONS)]
    try:
        request = greedy_request(prompt_ids(20, seed=9), 4)
        request.n = SLOTS  # every slot at once: idle sessions make room
        completion = parking.stub.Generate(request)
        assert len(completion.samples) == SLOTS
    finally:
        for session_id in ids:
            parking.stub.CloseSession(pb.CloseSessionRequest(session_id=session_id))


def test_past_the_memory_budget_a_new_session_is_refused(served_model: Path) -> None:
    with RunningServer(server_config(served_model, max_sessions=1, session_memory_mb=1)) as running:
        opened, refused = [], None
        for i in range(200):
            try:
                opened.append(prefill(running, prompt_ids(200, seed=500 + i)))
            except grpc.RpcError as error:
                refused = error
                break
        assert refused is not None and refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "session-memory-mb" in (refused.details() or "")
        assert len(opened) >= 2  # the budget, not the one slot, was the limit


def test_by_default_idle_sessions_park_in_half_the_free_memory(served_model: Path) -> None:
    with RunningServer(server_config(served_model, max_sessions=1)) as running:
        ids = [prefill(running, prompt_ids(30, seed=700 + i)) for i in range(3)]  # three on one slot
        stats = running.stub.GetEngineStats(pb.GetEngineStatsRequest())
        assert stats.parking.enabled and stats.sessions_open == 3 and stats.parking.sessions_parked == 2
        budget = running.server.serving.model.session_memory  # type: ignore[union-attr]
        assert 0 < budget <= host_memory_free_bytes() * 0.6
        for session_id in ids:
            running.stub.CloseSession(pb.CloseSessionRequest(session_id=session_id))


def test_free_memory_is_the_hosts_or_less_under_a_cgroup_limit(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text("MemTotal: 16000000 kB\nMemAvailable:    8000000 kB\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    assert host_memory_free_bytes(str(tmp_path / "meminfo"), str(cgroup)) == 8_000_000 * 1024
    (cgroup / "memory.max").write_text("max\n")  # v2, no limit
    (cgroup / "memory.current").write_text("1000\n")
    assert host_memory_free_bytes(str(tmp_path / "meminfo"), str(cgroup)) == 8_000_000 * 1024
    (cgroup / "memory.max").write_text(f"{4 << 30}\n")  # a pod's 4 GiB limit, 1 GiB used
    (cgroup / "memory.current").write_text(f"{1 << 30}\n")
    assert host_memory_free_bytes(str(tmp_path / "meminfo"), str(cgroup)) == 3 << 30
    (cgroup / "memory.max").unlink()
    (cgroup / "memory").mkdir()  # v1
    (cgroup / "memory" / "memory.limit_in_bytes").write_text(f"{2 << 30}\n")
    (cgroup / "memory" / "memory.usage_in_bytes").write_text(f"{1 << 29}\n")
    assert host_memory_free_bytes(str(tmp_path / "meminfo"), str(cgroup)) == (2 << 30) - (1 << 29)
    assert host_memory_free_bytes(str(tmp_path / "none"), str(tmp_path / "none")) == 0


TOKENS = ("alice=token-a", "bob=token-b")


def bearer(caller: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer token-{caller[0]}"),)


def open_as(running: RunningServer, caller: str, tokens: list[int]) -> str:
    request = pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=tokens)))
    return list(running.stub.Prefill(iter([request]), metadata=bearer(caller)))[-1].done.session_id


def parked_bytes(running: RunningServer) -> int:
    stats = running.stub.GetEngineStats(pb.GetEngineStatsRequest(), metadata=bearer("alice"))
    return int(stats.parking.parked_bytes)


def open_until_refused(running: RunningServer, caller: str, seed: int) -> tuple[list[str], grpc.RpcError]:
    """The caller's sessions opened until one is refused, parked bytes checked against the budget
    after each; the refusal."""
    budget = running.server.serving.model.session_memory  # type: ignore[union-attr]
    opened: list[str] = []
    for i in range(200):
        try:
            opened.append(open_as(running, caller, prompt_ids(200, seed=seed + i)))
        except grpc.RpcError as error:
            return opened, error
        assert parked_bytes(running) <= budget
    raise AssertionError(f"{caller} was never refused")


def test_a_caller_past_its_share_of_session_memory_is_refused_while_another_still_opens(
    served_model: Path,
) -> None:
    config = server_config(served_model, max_sessions=1, session_memory_mb=1, auth_tokens=TOKENS)
    with RunningServer(config) as running:
        alice, refused = open_until_refused(running, "alice", seed=800)
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "session-memory-per-caller-mb" in (refused.details() or "")
        assert len(alice) >= 2  # her share, not the one slot, was the limit
        bob = [open_as(running, "bob", prompt_ids(200, seed=900 + i)) for i in range(2)]
        assert len(bob) == 2 and parked_bytes(running) <= (1 << 20)


def test_at_the_budget_closing_a_session_in_a_slot_lets_a_new_one_open(served_model: Path) -> None:
    with RunningServer(server_config(served_model, max_sessions=1, session_memory_mb=1)) as running:
        opened, refused = open_until_refused(running, "anyone", seed=1000)
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "session-memory-mb" in (refused.details() or "")
        stats = running.stub.GetEngineStats(pb.GetEngineStatsRequest())
        assert stats.parking.sessions_parked == len(opened) - 1  # the last opened holds the slot
        running.stub.CloseSession(pb.CloseSessionRequest(session_id=opened.pop()))
        opened.append(prefill(running, prompt_ids(200, seed=1100)))  # takes the freed slot, parks none
        assert parked_bytes(running) <= 1 << 20


def test_parked_bytes_never_exceed_the_budget_as_sessions_swap_and_grow(served_model: Path) -> None:
    with RunningServer(server_config(served_model, max_sessions=1, session_memory_mb=1)) as running:
        opened, _ = open_until_refused(running, "anyone", seed=1200)
        for i in np.random.default_rng(3).permutation(len(opened)):
            try:
                decode(running, opened[int(i)], 4)  # grows the session: the next swap may not fit
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert parked_bytes(running) <= 1 << 20
        running.stub.CloseSession(pb.CloseSessionRequest(session_id=opened[0]))
        assert decode(running, opened[1], 1)  # a close makes room for the swap again
