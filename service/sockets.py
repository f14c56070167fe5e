"""Listening sockets for the HTTP API and /metrics: the any-address serves IPv4 and IPv6 on one socket.

asyncio's create_server makes an IPv6 socket IPv6-only (and the stdlib's servers bind IPv4 alone),
so `--host '[::]'` would refuse 127.0.0.1. Here `[::]`, `::` and "" bind one dual-stack socket
(IPV6_V6ONLY off), as gRPC does for `[::]`; any other host binds the first address it resolves to.
"""

from __future__ import annotations

import socket

ANY_HOSTS = ("", "::")  # after the brackets are stripped


def listening_socket(host: str, port: int, backlog: int = 128, share_port: bool = False) -> socket.socket:
    """A socket bound to host:port (0: a free port) and listening; OSError (EADDRINUSE) when held.
    `share_port`: SO_REUSEPORT, for processes that serve one port together (--frontends)."""
    name = host.strip("[]")
    address: tuple[str, int] | tuple[str, int, int, int] | tuple[int, bytes]
    if name in ANY_HOSTS:
        family, address = socket.AF_INET6, ("::", port)
    else:
        info = socket.getaddrinfo(name, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        family, address = info[0], info[4]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if share_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if name in ANY_HOSTS:  # one socket for both: Linux's default, but a sysctl can turn it off
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


def peer_host(peername: object) -> str:
    """The client's address as one string, an IPv4 client of a dual-stack socket as plain IPv4."""
    host = str(peername[0]) if isinstance(peername, tuple) and peername else ""
    return host.removeprefix("::ffff:") if "." in host else host
