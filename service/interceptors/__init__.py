"""The interceptors every Ladder call passes through, one concern each, outermost first (`chain`):

1. `AccessLog` (access_log.py): the request id, the count of calls in flight, and one access line
   and one metric per call, whatever ends it;
2. `StatusTable` (statuses.py): the drain gate, and each failure ended with its status from
   service/errors.py (telling the access log first);
3. `PeerCallLimit` (peer_calls.py): the calls one client address may have open (when limited);
4. `Authentication` (auth.py): the bearer-token check and the caller's name.
The access log is outermost so that every call, refused ones too, has a request id, a line and a
count; the gate comes before the token check, so a draining server says UNAVAILABLE to a caller
without a token too; the handlers' own refusals (bytes that do not parse, a message over the size
limit: service/grpc/parsing.py) come after both. Health and reflection pass them all untouched.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc

from service.interceptors.access_log import AccessLog
from service.interceptors.auth import Authentication
from service.interceptors.peer_calls import PeerCallLimit
from service.interceptors.statuses import StatusTable


def chain(
    access_log: AccessLog,
    gate: Callable[[], None],
    tokens: tuple[str, ...],
    peer_calls: PeerCallLimit | None = None,
) -> list[grpc.aio.ServerInterceptor]:
    """The interceptors for `grpc.aio.server(interceptors=...)`, which runs the first outermost."""
    return [
        access_log,
        StatusTable(gate, access_log.failed),
        peer_calls or PeerCallLimit(0),
        Authentication(tokens),
    ]
