"""How a client reaches a Ladder server: address, TLS, bearer token and default deadline.

Owns the one `Connection` value both clients take, and building sync and asyncio
channels from it. Guarantees: TLS is used whenever any TLS option is given, the
bearer token travels as `authorization: Bearer <token>` metadata on every call,
and a call without its own timeout gets the connection's default deadline.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio

# Generation replies may carry many token ids and per-token timings; allow more than gRPC's 4 MiB default.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
DEFAULT_ADDRESS = "127.0.0.1:50051"
HEALTH_CHECK = "/grpc.health.v1.Health/Check"  # the standard health service's one unary method


@dataclass(frozen=True)
class Connection:
    """Where the server is and how to authenticate to it."""

    address: str = DEFAULT_ADDRESS
    tls: bool = False
    root_certificate: Path | None = None
    client_certificate: Path | None = None
    client_key: Path | None = None
    server_name_override: str | None = None
    token: str | None = None
    timeout_s: float | None = 60.0

    @property
    def uses_tls(self) -> bool:
        return self.tls or any(
            p is not None for p in (self.root_certificate, self.client_certificate, self.client_key)
        )

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def deadline(self, timeout_s: float | None) -> float | None:
        return self.timeout_s if timeout_s is None else timeout_s


def _read(path: Path | None) -> bytes | None:
    return path.read_bytes() if path is not None else None


def channel_credentials(conn: Connection) -> grpc.ChannelCredentials:
    if (conn.client_certificate is None) != (conn.client_key is None):
        raise ValueError("mutual TLS needs both a client certificate and its key")
    return grpc.ssl_channel_credentials(
        root_certificates=_read(conn.root_certificate),
        private_key=_read(conn.client_key),
        certificate_chain=_read(conn.client_certificate),
    )


def channel_options(conn: Connection) -> list[tuple[str, str | int]]:
    options: list[tuple[str, str | int]] = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ]
    if conn.server_name_override:
        options.append(("grpc.ssl_target_name_override", conn.server_name_override))
    return options


def sync_channel(conn: Connection) -> grpc.Channel:
    if conn.uses_tls:
        return grpc.secure_channel(conn.address, channel_credentials(conn), channel_options(conn))
    return grpc.insecure_channel(conn.address, channel_options(conn))


def aio_channel(conn: Connection) -> grpc.aio.Channel:
    if conn.uses_tls:
        return grpc.aio.secure_channel(conn.address, channel_credentials(conn), channel_options(conn))
    return grpc.aio.insecure_channel(conn.address, channel_options(conn))
