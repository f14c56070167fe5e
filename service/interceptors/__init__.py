"""The interceptors every Ladder call passes through, one concern each, outermost first (`chain`):

1. `AccessLog` (access_log.py): the request id, the count of calls in flight, and one access line
   and one metric per call, whatever ends it;
2. `StatusTable` (statuses.py): the drain gate, and each failure ended with its status from
   service/errors.py (telling the access log first);
3. `Authentication` (auth.py): the bearer-token check and the caller's name.
The access log is outermost so that every call, refused ones too, has a request id, a line and a
count; the gate comes before the token check, so a draining server says UNAVAILABLE to a caller
without a token too; the handlers' own refusals (bytes that do not parse, a message over the size
limit: service/parsing.py) come after both. Health and reflection pass all three untouched.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc

from service.interceptors.access_log import AccessLog
from service.interceptors.auth import Authentication
from service.interceptors.statuses import StatusTable


def chain(access_log: AccessLog, gate: Callable[[], None], tokens: tuple[str, ...],
          on_internal: Callable[[BaseException], None] | None = None) -> list[grpc.aio.ServerInterceptor]:
    """The interceptors for `grpc.aio.server(interceptors=...)`, which runs the first outermost."""
    return [access_log, StatusTable(gate, access_log.failed, on_internal), Authentication(tokens)]
