"""One client address may have at most `limit` Ladder calls open at once (`--max-calls-per-peer`).

gRPC core caps streams per connection and connections per process, not per client: a client with
many connections could otherwise hold every call the server takes. Past the limit a call is refused
(PeerCalls: RESOURCE_EXHAUSTED, PEER_CALLS) before its handler runs, and counted. The address is the
peer without its port, so a client's connections add up; health and reflection never count.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncGenerator, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from service.errors import PeerCalls
from service.interceptors.base import Context, LadderInterceptor, Stream, Unary


def peer_address(peer: str) -> str:
    """ "ipv4:10.0.0.7:51234" -> "ipv4:10.0.0.7"; "ipv6:[::1]:5" -> "ipv6:[::1]"; other peers whole."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6") and ":" in rest:
        return f"{kind}:{rest.rsplit(':', 1)[0]}"
    return peer


class PeerCallLimit(LadderInterceptor):
    def __init__(self, limit: int, on_refused: Callable[[], None] = lambda: None) -> None:
        self.limit = limit  # 0: no limit
        self.on_refused = on_refused
        self.open: Counter[str] = Counter()

    @contextmanager
    def _held(self, context: Context) -> Iterator[None]:
        """One call of its peer's open while the block runs; PeerCalls when the peer has `limit`."""
        address = peer_address(context.peer() or "")
        if self.open[address] >= self.limit:
            self.on_refused()
            raise PeerCalls(
                f"{address} has {self.limit} calls open, the most one client address may "
                "have (--max-calls-per-peer)",
                metadata={"max_calls_per_peer": str(self.limit)},
            )
        self.open[address] += 1
        try:
            yield
        finally:
            self.open[address] -= 1
            if not self.open[address]:
                del self.open[address]

    def unary(self, name: str, behavior: Unary) -> Unary:
        if not self.limit:
            return behavior

        async def unary(request: Any, context: Context) -> Any:
            with self._held(context):
                return await behavior(request, context)

        return unary

    def stream(self, name: str, behavior: Stream) -> Stream:
        if not self.limit:
            return behavior

        async def stream(request: Any, context: Context) -> AsyncGenerator[Any, None]:
            responses = behavior(request, context)
            try:
                with self._held(context):
                    async for response in responses:
                        yield response
            finally:
                await responses.aclose()

        return stream
