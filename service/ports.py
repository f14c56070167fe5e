"""Ports the server listens on: a port another process holds is refused by name, before any load.

gRPC's own bind failure says neither which port nor why, and with SO_REUSEPORT (gRPC's default,
turned off in service/server.py) a second server would share a port instead of failing.
"""

from __future__ import annotations

import errno
import socket


class PortInUse(Exception):
    """A port the server must listen on is held by another process."""


def check_port_free(host: str, port: int, what: str) -> None:
    """Raise PortInUse when something already listens on host:port (port 0 is always free)."""
    if not port:
        return
    try:
        infos = socket.getaddrinfo(host.strip("[]") or None, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
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


def server_options(max_message_bytes: int, share_port: bool = False) -> list[tuple[str, int]]:
    """A grpc.aio server's options. gRPC's own receive limit sits above ours, so a request up to twice
    the limit gets our answer (parsing.py: INVALID_ARGUMENT, MESSAGE_TOO_LARGE, logged and counted);
    beyond that gRPC's own. SO_REUSEPORT only where frontends share the port on purpose (relay.py):
    otherwise a port another server holds fails here instead of being shared."""
    return [("grpc.max_receive_message_length", 2 * max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.so_reuseport", int(share_port))]
