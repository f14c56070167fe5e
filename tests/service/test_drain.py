"""Graceful drain: health flips at once, new calls are refused, calls in flight finish or end UNAVAILABLE."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proto.ladder.v1 import ladder_pb2 as pb
from tests.support.prompts import greedy_request
from tests.support.servers import RunningServer, both_ways, free_port, server_config
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVING = health_pb2.HealthCheckResponse.SERVING


def health_of(channel: grpc.Channel) -> int:
    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2).status


@both_ways
def test_drain_flips_health_refuses_new_calls_and_lets_a_call_in_flight_finish(
    served_model: Path, frontends: int
) -> None:
    running = RunningServer(server_config(served_model, frontends=frontends))
    parts: queue.Queue[pb.PrefillRequest | None] = queue.Queue()
    parts.put(pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=[5, 6, 7]))))
    stream = running.stub.Prefill(iter(parts.get, None))
    assert next(stream).HasField("forward")  # the Prefill call is in flight, its prompt unfinished
    drained = threading.Thread(target=lambda: running.run(running.server.drain(grace=10.0)))
    drained.start()
    # With frontends the server tells them to drain after it starts draining itself: a few
    # milliseconds later each flips its health and gates new calls (the channel reaches one).
    wait_for(lambda: running.server.draining and health_of(running.channel) == NOT_SERVING, what="health")
    with pytest.raises(grpc.RpcError) as caught:
        running.stub.Generate(greedy_request([5, 6], 2))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    parts.put(pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=[8, 9]))))
    parts.put(None)
    events = list(stream)
    assert events[-1].done.length == 5
    drained.join(timeout=15)
    assert not drained.is_alive()
    running.close()


@both_ways
def test_a_stream_still_running_at_the_end_of_the_grace_period_ends_unavailable(
    served_model: Path, frontends: int
) -> None:
    running = RunningServer(
        server_config(
            served_model, max_sessions=1, max_new_tokens=1000, session_memory_mb=0, frontends=frontends
        )
    )
    # The one KV slot is held by a session, so the stream waits for it: in flight, and it cannot
    # finish within the grace period however fast the model is.
    opening = pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=[5])))
    held = list(running.stub.Prefill(iter([opening])))
    assert held[-1].done.session_id
    stream = running.stub.GenerateStream(greedy_request([5, 6, 7], 1000))
    wait_for(lambda: running.scheduler.waiting == 1)
    drained = threading.Thread(target=lambda: running.run(running.server.drain(grace=0.1)))
    drained.start()
    with pytest.raises(grpc.RpcError) as caught:
        list(stream)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    drained.join(timeout=15)
    assert not drained.is_alive()
    running.close()


@both_ways
def test_sigterm_drains_the_server_process_and_it_exits_cleanly(served_model: Path, frontends: int) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LADDER_")}
    env.update(
        LADDER_HOST="127.0.0.1",
        LADDER_PORT=str(port),
        LADDER_METRICS_PORT="0",
        LADDER_HTTP_PORT="0",
        LADDER_MODEL=str(served_model),
        LADDER_POD_NAME="pod-s",
        LADDER_DRAIN_SECONDS="2",
        LADDER_FRONTENDS=str(frontends),
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "service"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    if health_of(channel) == SERVING:
                        break
                except grpc.RpcError:
                    time.sleep(0.05)
            assert health_of(channel) == SERVING
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
    logs = process.stderr.read().decode() if process.stderr else ""
    assert '"event": "draining"' in logs and '"event": "stopped"' in logs
    started = [json.loads(line) for line in logs.splitlines() if '"frontend_listening"' in line]
    assert len(started) == frontends
    for line in started:  # every frontend process has exited too
        assert not Path(f"/proc/{line['pid']}").exists()


@both_ways
def test_an_engine_fault_flips_health_and_drains_the_server(served_model: Path, frontends: int) -> None:
    from engine.errors import EngineFault

    running = RunningServer(server_config(served_model, frontends=frontends))
    running.fault(EngineFault("a forward failed on the device"))
    running.run(asyncio.wait_for(running.server.stopped.wait(), 10))
    assert running.server.draining and running.server.fault is not None
    with pytest.raises(grpc.RpcError) as caught:
        health_of(running.channel)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE  # not serving, then gone
    running.close()
