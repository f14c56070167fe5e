"""Ports the server listens on: a port another process holds is refused by name, before any load;
the gRPC server's options, with what connections may hold and how long a slow or idle one lives.

gRPC's own bind failure says neither which port nor why, and with SO_REUSEPORT (gRPC's default,
turned off in service/server.py) a second server would share a port instead of failing.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

from service.limits import file_limit

if TYPE_CHECKING:
    from service.config import Config

KEEPALIVE_MS = 60_000  # the server pings a connection quiet this long
KEEPALIVE_TIMEOUT_MS = 20_000  # and closes it when the ping goes unanswered this long
MIN_PING_INTERVAL_MS = 10_000  # a client's pings closer than this without calls are strikes
MAX_PING_STRIKES = 2


GRPC_PORT = "gRPC port (--port/LADDER_PORT)"
HTTP_PORT = "HTTP port (--http-port/LADDER_HTTP_PORT; 0 turns it off)"
METRICS_PORT = "metrics port (--metrics-port/LADDER_METRICS_PORT; 0 turns it off)"


class PortInUse(Exception):
    """A port the server must listen on is held by another process."""


def check_ports_free(config: Config) -> None:
    """Raise PortInUse naming the first of the server's ports (gRPC, HTTP, metrics) another process holds."""
    for port, what in (
        (config.port, GRPC_PORT),
        (config.http_port, HTTP_PORT),
        (config.metrics_port, METRICS_PORT),
    ):
        check_port_free(config.host, port, what)


def check_port_free(host: str, port: int, what: str) -> None:
    """Raise PortInUse when something already listens on host:port (port 0 is always free)."""
    if not port:
        return
    try:
        infos = socket.getaddrinfo(
            host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror:
        return  # gRPC reports an address it cannot resolve itself
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUse(f"{what} {port} on {host} is in use by another process") from None
            raise


@dataclass(frozen=True)
class ConnectionLimits:
    """What one connection, and all of them, may hold on a gRPC port (Config's grpc_* fields); plain
    values, computed in the process that binds the port (a frontend raises its own file limit first)."""

    max_connections: int | None = None  # None: half the open-file limit of the process serving the port
    max_concurrent_streams: int = 4096
    handshake_timeout_seconds: float = 10.0
    idle_timeout_seconds: float = 120.0

    @classmethod
    def of(cls, config: Config) -> ConnectionLimits:
        return cls(
            config.grpc_max_connections,
            config.grpc_max_concurrent_streams,
            config.grpc_handshake_timeout_seconds,
            config.grpc_idle_timeout_seconds,
        )

    def connections(self) -> int:
        """The cap on connections open at once: past it gRPC closes a new one as it is accepted."""
        return self.max_connections if self.max_connections is not None else max(64, file_limit() // 2)


def server_options(
    max_message_bytes: int, limits: ConnectionLimits = ConnectionLimits(), share_port: bool = False
) -> list[tuple[str, int]]:
    """A grpc.aio server's options. gRPC's own receive limit sits above ours, so a request up to twice
    the limit gets our answer (parsing.py: INVALID_ARGUMENT, MESSAGE_TOO_LARGE, logged and counted);
    beyond that gRPC's own. SO_REUSEPORT only where frontends share the port on purpose (frontend.py):
    otherwise a port another server holds fails here instead of being shared. The rest bounds what
    idle, slow or dead connections hold (docs/configuration.md, Connections)."""
    return [
        ("grpc.max_receive_message_length", 2 * max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", int(share_port)),
        *connection_options(limits),
    ]


def connection_options(limits: ConnectionLimits) -> list[tuple[str, int]]:
    """Caps on connections and streams, timeouts for slow handshakes and idle connections, and
    keepalive: the server pings a quiet client (a dead one is closed) and refuses pings more often
    than every 10 s without calls (a ping flood ends with GOAWAY after two strikes)."""
    return [
        ("grpc.max_allowed_incoming_connections", limits.connections()),
        ("grpc.max_concurrent_streams", limits.max_concurrent_streams),
        ("grpc.server_handshake_timeout_ms", int(limits.handshake_timeout_seconds * 1000)),
        ("grpc.max_connection_idle_ms", int(limits.idle_timeout_seconds * 1000)),
        ("grpc.keepalive_time_ms", KEEPALIVE_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.http2.min_ping_interval_without_data_ms", MIN_PING_INTERVAL_MS),
        ("grpc.http2.max_ping_strikes", MAX_PING_STRIKES),
    ]
