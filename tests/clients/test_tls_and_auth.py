"""The clients' TLS, mutual TLS and bearer-token options against a real server that requires all three."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from clients.python import Connection, LadderClient, Stopping, completion_of
from clients.python.cli import main
from tests.support.pki import make_pki
from tests.support.servers import RunningServer, server_config


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cwd = make_pki(tmp_path_factory.mktemp("pki"))
    (cwd / "alice.token").write_text("tok-alice\n")
    return cwd


@pytest.fixture(scope="module")
def secure_server(pki: Path, served_model: Path) -> Iterator[RunningServer]:
    config = server_config(
        served_model,
        tls_cert=str(pki / "server.pem"),
        tls_key=str(pki / "server.key"),
        tls_client_ca=str(pki / "ca.pem"),
        auth_tokens=("alice=tok-alice", "bob=tok-bob"),
    )
    with RunningServer(config) as live:
        yield live


def connection(server: RunningServer, pki: Path, token: str | None, client_cert: bool = True) -> Connection:
    return Connection(
        address=server.address,
        root_certificate=pki / "ca.pem",
        token=token,
        timeout_s=20,
        client_certificate=pki / "client.pem" if client_cert else None,
        client_key=pki / "client.key" if client_cert else None,
    )


def test_a_client_with_the_ca_its_certificate_and_a_token_generates(
    secure_server: RunningServer, pki: Path
) -> None:
    with LadderClient(connection(secure_server, pki, "tok-alice")) as client:
        completion = client.generate("secure", stopping=Stopping(max_new_tokens=3, ignore_eos=True))
    assert len(completion.token_ids) == 3


def test_a_plaintext_client_is_refused_by_the_tls_server(secure_server: RunningServer) -> None:
    with LadderClient(Connection(secure_server.address, token="tok-alice", timeout_s=5)) as client:
        with pytest.raises(grpc.RpcError) as failure:
            client.generate([1, 2, 3], stopping=Stopping(max_new_tokens=1))
    assert failure.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_client_without_its_certificate_is_refused_by_mutual_tls(
    secure_server: RunningServer, pki: Path
) -> None:
    with LadderClient(connection(secure_server, pki, "tok-alice", client_cert=False)) as client:
        with pytest.raises(grpc.RpcError) as failure:
            client.generate([1, 2, 3], stopping=Stopping(max_new_tokens=1))
    assert failure.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_wrong_token_is_unauthenticated(secure_server: RunningServer, pki: Path) -> None:
    with LadderClient(connection(secure_server, pki, "tok-mallory")) as client:
        with pytest.raises(grpc.RpcError) as failure:
            client.generate([1, 2, 3], stopping=Stopping(max_new_tokens=1))
    assert failure.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_another_caller_cannot_decode_a_session_it_did_not_open(
    secure_server: RunningServer, pki: Path
) -> None:
    with (
        LadderClient(connection(secure_server, pki, "tok-alice")) as alice,
        LadderClient(connection(secure_server, pki, "tok-bob")) as bob,
    ):
        _, done = alice.prefill([[5, 6, 7, 8]])
        with pytest.raises(grpc.RpcError) as failure:
            completion_of(bob.decode(done.session_id, 2))
        assert failure.value.code() == grpc.StatusCode.NOT_FOUND
        assert (
            len(
                completion_of(
                    alice.decode(done.session_id, 2, stopping=Stopping(2, ignore_eos=True))
                ).token_ids
            )
            == 2
        )
        alice.close_session(done.session_id)


def test_the_cli_connects_with_tls_flags_and_a_token_file(
    secure_server: RunningServer, pki: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "stats",
        "--address",
        secure_server.address,
        "--ca",
        str(pki / "ca.pem"),
        "--cert",
        str(pki / "client.pem"),
        "--key",
        str(pki / "client.key"),
        "--token-file",
        str(pki / "alice.token"),
    ]
    assert main(argv) == 0
    assert '"vocab_size": 512' in capsys.readouterr().out
