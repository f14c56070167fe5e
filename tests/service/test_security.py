"""TLS, mutual TLS, bearer tokens, and sessions bound to the caller that opened them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proto.ladder.v1 import ladder_pb2 as pb
from proto.ladder.v1 import ladder_pb2_grpc
from tests.support.prompts import greedy_request
from tests.support.servers import FRONTENDS, FRONTENDS_IDS, RunningServer, both_ways, server_config


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A throwaway CA, a server certificate for 127.0.0.1/localhost, and a client certificate."""
    d = tmp_path_factory.mktemp("pki")
    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=ladder-test-ca",
        "-keyout",
        str(d / "ca.key"),
        "-out",
        str(d / "ca.pem"),
    )
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("server", "client", "other"):
        openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN={name}",
            "-keyout",
            str(d / f"{name}.key"),
            "-out",
            str(d / f"{name}.csr"),
        )
        openssl(
            "x509",
            "-req",
            "-in",
            str(d / f"{name}.csr"),
            "-CA",
            str(d / "ca.pem"),
            "-CAkey",
            str(d / "ca.key"),
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            str(d / "san.ext"),
            "-out",
            str(d / f"{name}.pem"),
        )
    return d


def tls_channel(server: RunningServer, pki: Path, client_cert: str = "") -> grpc.Channel:
    pair = {}
    if client_cert:
        pair = {
            "private_key": (pki / f"{client_cert}.key").read_bytes(),
            "certificate_chain": (pki / f"{client_cert}.pem").read_bytes(),
        }
    credentials = grpc.ssl_channel_credentials((pki / "ca.pem").read_bytes(), **pair)
    return grpc.secure_channel(server.address, credentials)


def generate_over(channel: grpc.Channel) -> int:
    reply = ladder_pb2_grpc.LadderStub(channel).Generate(greedy_request([5, 6, 7], 2), timeout=5)
    return len(reply.token_ids)


@both_ways
def test_a_tls_server_refuses_plaintext_and_serves_tls(served_model: Path, pki: Path, frontends: int) -> None:
    running = RunningServer(
        server_config(
            served_model,
            tls_cert=str(pki / "server.pem"),
            tls_key=str(pki / "server.key"),
            frontends=frontends,
        )
    )
    try:
        with pytest.raises(grpc.RpcError) as caught:
            running.stub.Generate(greedy_request([5, 6, 7], 2), timeout=5)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        with tls_channel(running, pki) as channel:
            assert generate_over(channel) == 2
    finally:
        running.close()


@both_ways
def test_mutual_tls_refuses_a_client_without_a_certificate_and_binds_sessions_to_it(
    served_model: Path, pki: Path, frontends: int
) -> None:
    config = server_config(
        served_model,
        tls_cert=str(pki / "server.pem"),
        tls_key=str(pki / "server.key"),
        tls_client_ca=str(pki / "ca.pem"),
        frontends=frontends,
    )
    running = RunningServer(config)
    try:
        with tls_channel(running, pki) as channel, pytest.raises(grpc.RpcError) as caught:
            generate_over(channel)
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        with tls_channel(running, pki, client_cert="client") as channel:
            assert generate_over(channel) == 2
            part = pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=[5])))
            session_id = list(ladder_pb2_grpc.LadderStub(channel).Prefill(iter([part])))[-1].done.session_id
        # Under mTLS the certificate names the caller: another certificate cannot see the session.
        with tls_channel(running, pki, client_cert="other") as other, pytest.raises(grpc.RpcError) as caught:
            ladder_pb2_grpc.LadderStub(other).Rewind(pb.RewindRequest(session_id=session_id))
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        running.close()


@pytest.fixture(scope="module", params=FRONTENDS, ids=FRONTENDS_IDS)
def authed(served_model: Path, request: pytest.FixtureRequest) -> RunningServer:
    running = RunningServer(
        server_config(
            served_model,
            auth_tokens=("alice=token-a", "bob=token-b"),
            sessions_per_caller=2,
            frontends=request.param,
        )
    )
    yield running  # type: ignore[misc]
    running.close()


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def test_a_missing_or_wrong_token_is_unauthenticated_and_health_needs_none(authed: RunningServer) -> None:
    for metadata in ((), bearer("token-x"), (("authorization", "token-a"),)):
        with pytest.raises(grpc.RpcError) as caught:
            authed.stub.Generate(greedy_request([5, 6], 2), metadata=metadata)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    reply = health_pb2_grpc.HealthStub(authed.channel).Check(health_pb2.HealthCheckRequest())
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    assert len(authed.stub.Generate(greedy_request([5, 6], 2), metadata=bearer("token-a")).token_ids) == 2


def open_session(server: RunningServer, token: str) -> str:
    part = pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=[5, 6, 7])))
    return list(server.stub.Prefill(iter([part]), metadata=bearer(token)))[-1].done.session_id


def test_a_second_caller_cannot_see_the_first_callers_session(authed: RunningServer) -> None:
    session_id = open_session(authed, "token-a")
    decode = pb.DecodeRequest(session_id=session_id, stopping=pb.StoppingOptions(max_new_tokens=2))
    close = pb.CloseSessionRequest(session_id=session_id)
    for call in (
        lambda m: list(authed.stub.Decode(decode, metadata=m)),
        lambda m: authed.stub.Rewind(pb.RewindRequest(session_id=session_id), metadata=m),
        lambda m: authed.stub.CloseSession(close, metadata=m),
    ):
        with pytest.raises(grpc.RpcError) as caught:
            call(bearer("token-b"))
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert len(list(authed.stub.Decode(decode, metadata=bearer("token-a")))) == 3
    authed.stub.CloseSession(pb.CloseSessionRequest(session_id=session_id), metadata=bearer("token-a"))


def test_a_caller_holds_at_most_sessions_per_caller_sessions(authed: RunningServer) -> None:
    held = [open_session(authed, "token-a") for _ in range(2)]
    with pytest.raises(grpc.RpcError) as caught:
        open_session(authed, "token-a")
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    other = open_session(authed, "token-b")
    for session_id, token in [(s, "token-a") for s in held] + [(other, "token-b")]:
        authed.stub.CloseSession(pb.CloseSessionRequest(session_id=session_id), metadata=bearer(token))


def test_session_ids_name_the_pod_and_carry_128_random_bits(server: RunningServer) -> None:
    part = pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=[5])))
    ids = [list(server.stub.Prefill(iter([part])))[-1].done.session_id for _ in range(4)]
    for session_id in ids:
        pod, _, token = session_id.partition(".")
        assert pod == "pod-a" and len(token) >= 22  # token_urlsafe(16): 16 random bytes
        server.stub.CloseSession(pb.CloseSessionRequest(session_id=session_id))
    assert len(set(ids)) == 4
