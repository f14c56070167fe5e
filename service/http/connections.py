"""What connections may hold on the HTTP listener: how many at once, in all and from one address, and
how long a client may take to send a request's headers.

aiohttp closes idle keep-alive connections itself (keepalive_timeout) but has no cap on connections
and no header timeout, so each connection's handler here (`GuardedHandler`) is admitted by the
listener's `Guard` as it is accepted (past a cap: closed at once, counted in
ladder_connections_refused_total) and arms a timer while it waits for headers (a fresh connection,
or the first bytes of the next request on a kept-alive one): headers not complete in time close it
(ladder_connections_timed_out_total).
"""

from __future__ import annotations

import asyncio
import socket
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from service.sockets import peer_host

LISTENER = "http"


@dataclass(frozen=True)
class HttpLimits:
    max_connections: int = 2048
    max_connections_per_peer: int = 256
    header_timeout_seconds: float = 10.0
    idle_timeout_seconds: float = 75.0


class Guard:
    """The connections open on one listener, in all and per client address."""

    def __init__(
        self, limits: HttpLimits, refused: Callable[[str, str], None], timed_out: Callable[[str], None]
    ) -> None:
        self.limits = limits
        self.refused = refused  # (listener, reason)
        self.timed_out = timed_out  # (listener)
        self.open = 0
        self.by_peer: Counter[str] = Counter()

    def admit(self, peer: str) -> bool:
        """Count a new connection in, or refuse it (counted by the cap it was over)."""
        reason = (
            "connections"
            if self.open >= self.limits.max_connections
            else "connections_per_peer"
            if self.by_peer[peer] >= self.limits.max_connections_per_peer
            else ""
        )
        if reason:
            self.refused(LISTENER, reason)
            return False
        self.open += 1
        self.by_peer[peer] += 1
        return True

    def release(self, peer: str) -> None:
        self.open -= 1
        self.by_peer[peer] -= 1
        if not self.by_peer[peer]:
            del self.by_peer[peer]

    def handlers(self, server: web.Server, **kwargs: Any) -> Callable[[], GuardedHandler]:
        """The protocol factory for loop.create_server: aiohttp's handler, guarded."""
        loop = asyncio.get_running_loop()
        return lambda: GuardedHandler(
            self, server, loop=loop, keepalive_timeout=self.limits.idle_timeout_seconds, **kwargs
        )


class GuardedHandler(RequestHandler):
    """aiohttp's connection handler, admitted by the guard and timed while it waits for headers.

    Reads two of aiohttp's private fields (checked against aiohttp 3.14 by
    tests/service/test_http_hardening.py): `_request_count`, the requests whose headers were parsed,
    and `_waiter`, pending while the connection waits for the next request."""

    def __init__(self, guard: Guard, manager: web.Server, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._guard = guard
        self._peer: str | None = None  # set once admitted
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = peer_host(transport.get_extra_info("peername"))
        if not self._guard.admit(peer):
            sock = transport.get_extra_info("socket")
            if sock is not None:  # a reset, not a FIN: the client learns at once
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            transport.close()
            return
        self._peer = peer
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._peer is None:  # refused: aiohttp never saw it
            return
        self._guard.release(self._peer)
        self._peer = None
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        parsed = self._request_count
        super().data_received(data)
        if self._request_count > parsed:
            self._disarm()
        elif self._header_timer is None and self._waiter is not None and not self._waiter.done():
            self._arm()  # the first bytes of the next request on a kept-alive connection

    def _arm(self) -> None:
        self._disarm()
        parsed = self._request_count
        self._header_timer = self._loop.call_later(
            self._guard.limits.header_timeout_seconds, self._headers_late, parsed
        )

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self, parsed: int) -> None:
        self._header_timer = None
        if self._request_count == parsed and self.transport is not None:
            self._guard.timed_out(LISTENER)
            self.force_close()


class GuardedSite(web.BaseSite):
    """aiohttp's SockSite, serving with guarded handlers: a listening socket (service/sockets.py)
    handed to loop.create_server."""

    def __init__(self, runner: web.BaseRunner, sock: socket.socket, guard: Guard, ssl_context: Any) -> None:
        super().__init__(runner, ssl_context=ssl_context)
        self._sock = sock
        self._guard = guard

    @property
    def name(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"{'https' if self._ssl_context else 'http'}://[{host}]:{port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        factory = self._guard.handlers(server, access_log=None)
        self._server = await asyncio.get_running_loop().create_server(
            factory, sock=self._sock, ssl=self._ssl_context, backlog=self._backlog
        )
