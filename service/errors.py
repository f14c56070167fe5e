"""Every failure a call can end with, and the one table that maps it to a gRPC status.

Handlers raise; the interceptor (service/security.py) looks the exception up
here and aborts the call. Nothing else builds a status. Request errors fail
one call and leave every other session untouched; an EngineFault flips health.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from engine.errors import EngineFault, Exhausted, InvalidInput, OutOfRange, Unsupported

OWNER_METADATA = "ladder-session-owner"


class ServiceError(Exception):
    """Base of the service's own request errors."""


class SessionNotFound(ServiceError):
    """No such session on this pod (or it belongs to another caller)."""


class WrongPod(ServiceError):
    """The session id names another pod; the caller should route there."""

    def __init__(self, session_id: str, owner: str) -> None:
        super().__init__(f"session {session_id} is held by pod {owner!r}, not this one")
        self.owner = owner


class SessionBusy(ServiceError):
    """Another call is using the session right now."""


class QueueFull(ServiceError):
    """The engine worker holds as many requests as it may, or the caller has all its sessions."""


class Draining(ServiceError):
    """The server is shutting down and takes no new work."""


class NoTokenizer(ServiceError):
    """Text or chat input, or stop sequences, on a model directory without a tokenizer."""


class Unauthenticated(ServiceError):
    """Missing or unknown bearer token."""


class LimitExceeded(ServiceError):
    """Over a server limit: prompt length or max_new_tokens."""


class InvalidRequest(ServiceError):
    """A malformed request the engine never sees: no prompt, bad sampling values."""


class Cancelled(ServiceError):
    """The client went away (or its deadline passed) while the engine worked for it."""


# Most specific first: the first class an exception is an instance of wins.
STATUS_TABLE: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (InvalidInput, grpc.StatusCode.INVALID_ARGUMENT),
    (InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (OutOfRange, grpc.StatusCode.OUT_OF_RANGE),
    (LimitExceeded, grpc.StatusCode.OUT_OF_RANGE),
    (SessionNotFound, grpc.StatusCode.NOT_FOUND),
    (WrongPod, grpc.StatusCode.FAILED_PRECONDITION),
    (NoTokenizer, grpc.StatusCode.FAILED_PRECONDITION),
    (Unsupported, grpc.StatusCode.FAILED_PRECONDITION),
    (SessionBusy, grpc.StatusCode.ABORTED),
    (Exhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (QueueFull, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (Draining, grpc.StatusCode.UNAVAILABLE),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (Cancelled, grpc.StatusCode.CANCELLED),
    (EngineFault, grpc.StatusCode.INTERNAL),
)


@dataclass(frozen=True)
class Status:
    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, str], ...] = ()


def status_for(error: BaseException) -> Status:
    """The status a call ends with when `error` escapes its handler."""
    for kind, code in STATUS_TABLE:
        if isinstance(error, kind):
            metadata = ((OWNER_METADATA, error.owner),) if isinstance(error, WrongPod) else ()
            return Status(code, str(error) or kind.__name__, metadata)
    return Status(grpc.StatusCode.INTERNAL, f"internal error: {type(error).__name__}")
