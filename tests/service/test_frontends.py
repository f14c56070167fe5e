"""--frontends: the gRPC port served by frontend processes whose calls reach the server's core as orders.

Every test that uses the service tests' `server` fixture also runs against two frontends
(tests/service/conftest.py), as do the drain and TLS tests; these are what only frontends have:
processes of their own that share one port, and what happens when one of them goes away.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proto.ladder.v1 import ladder_pb2 as pb
from proto.ladder.v1 import ladder_pb2_grpc
from service.ports import PortInUse
from service.served_model import ModelView
from service.server import create_server
from tests.support.prompts import greedy_request, prompt_ids
from tests.support.servers import RunningServer, free_port, server_config
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
CHANNELS = 16  # connections, each to the frontend the kernel picks: all on one of two has odds 2^-15


def own_connection(address: str) -> grpc.Channel:
    """A channel with a connection of its own (not shared with the process's other channels)."""
    return grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])


def frontends_of(running: RunningServer) -> list[int]:
    assert running.server.frontends is not None
    return [p.pid for p in running.server.frontends.processes]


def test_frontends_share_one_port_and_any_continues_a_session_another_opened(served_model: Path) -> None:
    with RunningServer(server_config(served_model, frontends=2)) as running:
        assert len(set(frontends_of(running))) == 2 and os.getpid() not in frontends_of(running)
        channels = [own_connection(running.address) for _ in range(CHANNELS)]
        try:
            stubs = [ladder_pb2_grpc.LadderStub(channel) for channel in channels]
            tokens = prompt_ids(40, seed=71)
            part = pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=tokens)))
            session_id = list(stubs[0].Prefill(iter([part])))[-1].done.session_id
            continued = []
            for stub in stubs:  # one token a call, each through its own connection
                request = pb.DecodeRequest(
                    session_id=session_id, stopping=pb.StoppingOptions(max_new_tokens=1, ignore_eos=True)
                )
                continued += [e.token.id for e in stub.Decode(request) if e.HasField("token")]
            whole = running.stub.Generate(greedy_request(tokens, CHANNELS)).token_ids
            assert continued == list(whole)
            stubs[-1].CloseSession(pb.CloseSessionRequest(session_id=session_id))
            assert running.server.frontends is not None
            assert all(calls > 0 for calls in running.frontend_calls())
        finally:
            for channel in channels:
                channel.close()


def test_a_frontend_that_exits_flips_health_and_drains_the_server(served_model: Path) -> None:
    running = RunningServer(server_config(served_model, frontends=2))
    try:
        os.kill(frontends_of(running)[1], signal.SIGKILL)
        running.run(asyncio.wait_for(running.server.stopped.wait(), 20))
        assert running.server.draining and "gRPC frontend 1 exited" in str(running.server.fault)
        for pid in frontends_of(running):  # the other one was told to stop, and has
            wait_for(lambda pid=pid: not Path(f"/proc/{pid}").exists() or _zombie(pid))
    finally:
        running.close()


def test_a_frontend_killed_mid_stream_ends_its_streams_unavailable_and_the_others_finish(
    served_model: Path,
) -> None:
    # A stream through each frontend; one frontend is killed while both stream. Its client hears
    # UNAVAILABLE (its connection is gone); the server drains, and the stream through the other
    # frontend is served to its end within the drain before the server stops.
    running = RunningServer(server_config(served_model, frontends=2, drain_seconds=20.0))
    channels = [own_connection(running.address) for _ in range(CHANNELS)]
    try:
        frontends = running.server.frontends
        assert frontends is not None
        served_by = {}  # frontend index -> a stub whose connection it serves
        for channel in channels:
            stub = ladder_pb2_grpc.LadderStub(channel)
            before = running.frontend_calls()
            stub.GetModelInfo(pb.GetModelInfoRequest())
            served_by.setdefault(
                [a - b for a, b in zip(running.frontend_calls(), before, strict=True)].index(1), stub
            )
        assert set(served_by) == {0, 1}
        request = greedy_request(prompt_ids(8, seed=72), 240)
        doomed, survivor = served_by[0].GenerateStream(request), served_by[1].GenerateStream(request)
        assert next(doomed).HasField("token") and next(survivor).HasField("token")
        os.kill(frontends_of(running)[0], signal.SIGKILL)
        with pytest.raises(grpc.RpcError) as caught:
            list(doomed)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        events = list(survivor)
        assert events[-1].done.finish_reason == pb.FINISH_REASON_LENGTH
        assert sum(e.HasField("token") for e in events) == 240 - 1
        running.run(asyncio.wait_for(running.server.stopped.wait(), 30))
        assert "gRPC frontend 0 exited" in str(running.server.fault)
    finally:
        for channel in channels:
            channel.close()
        running.close()


def _zombie(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_port_another_process_holds_is_refused_before_any_frontend_serves(served_model: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        config = server_config(served_model, frontends=2, port=port)

        async def start() -> None:
            await create_server(config)

        with pytest.raises(PortInUse, match=str(port)):
            asyncio.run(start())


def test_health_watch_through_a_frontend_sees_the_drain(served_model: Path) -> None:
    running = RunningServer(server_config(served_model, frontends=2, drain_seconds=1.0))
    try:
        watch = health_pb2_grpc.HealthStub(running.channel).Watch(health_pb2.HealthCheckRequest())
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        running.loop.call_soon_threadsafe(lambda: asyncio.ensure_future(running.server.drain()))
        assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
        watch.cancel()
        running.run(asyncio.wait_for(running.server.stopped.wait(), 20))
    finally:
        running.close()


def test_frontends_end_streams_unavailable_and_exit_when_the_server_process_is_killed(
    served_model: Path, tmp_path: Path
) -> None:
    port = free_port()
    # As a deployment starts it: no LADDER_ settings, and no protobuf backend asked for (importing
    # onnxruntime_extensions in this process asked for the pure-Python one).
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("LADDER_") and k != "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"
    }
    env.update(
        LADDER_HOST="127.0.0.1",
        LADDER_PORT=str(port),
        LADDER_METRICS_PORT="0",
        LADDER_HTTP_PORT="0",
        LADDER_MODEL=str(served_model),
        LADDER_FRONTENDS="2",
    )
    log = tmp_path / "server.log"
    with log.open("wb") as sink:
        process = subprocess.Popen([sys.executable, "-m", "service"], cwd=REPO, env=env, stderr=sink)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            wait_for(lambda: _serving(health), what="the server serving")
            lines = log.read_text().splitlines()
            listening = [json.loads(line) for line in lines if "frontend_listening" in line]
            pids = [line["pid"] for line in listening]
            assert len(pids) == 2
            # The server's own protobuf backend, not the pure-Python one an import asks for.
            assert [line["protobuf"] for line in listening] == ["upb", "upb"]
            stream = ladder_pb2_grpc.LadderStub(channel).GenerateStream(greedy_request([5, 6, 7], 250))
            assert next(stream).HasField("token")  # streaming when the core goes
            process.kill()  # no drain, no word to the frontends: they see their link close
            process.wait(timeout=10)
            with pytest.raises(grpc.RpcError) as caught:
                list(stream)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        for pid in pids:
            wait_for(lambda pid=pid: not Path(f"/proc/{pid}").exists() or _zombie(pid), what="frontends gone")
    finally:
        if process.poll() is None:
            process.kill()


def _serving(health: health_pb2_grpc.HealthStub) -> bool:
    try:
        status = health.Check(health_pb2.HealthCheckRequest(), timeout=2).status
    except grpc.RpcError:
        return False
    return bool(status == health_pb2.HealthCheckResponse.SERVING)


def test_a_model_view_built_from_the_spec_a_frontend_is_sent_has_the_servers_limits(
    served_model: Path,
) -> None:
    config = server_config(served_model, max_new_tokens=77, default_max_new_tokens=0, max_prompt_tokens=0)
    with RunningServer(config) as running:
        assert running.server.serving is not None
        model = running.server.serving.model
        view = ModelView(pickle.loads(pickle.dumps(model.spec)), model.tokenizer)

        def limits(m: ModelView) -> tuple[object, ...]:
            return (m.facts, m.name, m.api_names, m.capacity, m.max_prompt_tokens, m.max_new_tokens)

        assert limits(view) == limits(model)
        assert (view.max_new_tokens, view.default_new_tokens, view.max_prompt_tokens) == (
            77,
            77,
            model.capacity,
        )
