"""Every failure a call can end with, and the one table that maps it to a gRPC status.

Handlers raise; the status-table interceptor (service/interceptors/statuses.py)
looks the exception up here and aborts the call. Nothing else builds a status. Request errors fail
one call and leave every other session untouched; an EngineFault flips health.

Every status also carries a `google.rpc.Status` in the `grpc-status-details-bin`
trailer (read it with grpc_status.rpc_status.from_call): an ErrorInfo whose
`reason` is stable per case (REASONS, or the one an error names when it is
raised; docs/api.md lists them) in domain "ladder.v1", a RetryInfo on
RESOURCE_EXHAUSTED and UNAVAILABLE, and a BadRequest field violation on
INVALID_ARGUMENT and OUT_OF_RANGE naming the request field at fault.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2

from engine.errors import EngineFault, Exhausted, InvalidInput, OverCapacity, Unsupported

OWNER_METADATA = "ladder-session-owner"
DETAILS_METADATA = "grpc-status-details-bin"
DOMAIN = "ladder.v1"


class ServiceError(Exception):
    """Base of the service's own request errors.

    `reason` names the case in the status details (default: the class's entry in REASONS);
    `field` is the request field at fault (a BadRequest field violation), "" when none is;
    `metadata` goes into the ErrorInfo."""

    def __init__(
        self, *args: object, reason: str = "", field: str = "", metadata: dict[str, str] | None = None
    ) -> None:
        super().__init__(*args)
        self.reason = reason
        self.field = field
        self.metadata = metadata or {}


class SessionNotFound(ServiceError):
    """No such session on this pod (or it belongs to another caller)."""


class WrongPod(ServiceError):
    """The session id names another pod; the caller should route there."""

    def __init__(self, session_id: str, owner: str) -> None:
        super().__init__(f"session {session_id} is held by pod {owner!r}, not this one")
        self.owner = owner


class SessionBusy(ServiceError):
    """Another call is using the session right now."""


class ForkExists(ServiceError):
    """The caller's fork of this fork_id exists and was forked from another session or to another length."""


class QueueFull(ServiceError):
    """The engine worker holds as many requests as it may (SESSIONS_FULL when they wait for a KV slot)."""


class CallerQuota(ServiceError):
    """The caller holds (or waits for) its share of the KV slots: `--sessions-per-caller`."""


class PeerCalls(ServiceError):
    """The client's address has `--max-calls-per-peer` Ladder calls open already."""


class Draining(ServiceError):
    """The server is shutting down and takes no new work."""


def refuse_unless_serving(draining: bool, loaded: bool) -> None:
    """The gate every call passes (the server's process and each frontend): UNAVAILABLE while the
    server drains, and while its model has not loaded (MODEL_LOADING)."""
    if draining:
        raise Draining("the server is draining; retry on another replica")
    if not loaded:
        raise Draining("the server is loading its model; retry shortly", reason="MODEL_LOADING")


class NoTokenizer(ServiceError):
    """Text or chat input, or stop sequences, on a model directory without a tokenizer."""


class Unauthenticated(ServiceError):
    """Missing or unknown bearer token."""


class OverLimit(ServiceError):
    """Over a limit the server is configured with: prompt length, max_new_tokens, n.

    Beside engine.errors.OverCapacity (the KV capacity, a fact of the model and pool),
    with the same status; a malformed request is engine.errors.InvalidInput, wherever found."""


class TooLarge(ServiceError):
    """A message over --max-message-bytes: the request (MESSAGE_TOO_LARGE), or the answer it asks
    for (RESPONSE_TOO_LARGE, refused before any work when even its smallest encoding is over).
    INVALID_ARGUMENT with no RetryInfo: the same request fails again."""


class Cancelled(ServiceError):
    """The client went away (or its deadline passed) while the engine worked for it."""


class ModelNotFound(ServiceError):
    """The OpenAI-compatible API named a model this server does not serve."""


# Most specific first: the first class an exception is an instance of wins.
STATUS_TABLE: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (InvalidInput, grpc.StatusCode.INVALID_ARGUMENT),
    (TooLarge, grpc.StatusCode.INVALID_ARGUMENT),
    (OverCapacity, grpc.StatusCode.OUT_OF_RANGE),
    (OverLimit, grpc.StatusCode.OUT_OF_RANGE),
    (SessionNotFound, grpc.StatusCode.NOT_FOUND),
    (ModelNotFound, grpc.StatusCode.NOT_FOUND),
    (WrongPod, grpc.StatusCode.FAILED_PRECONDITION),
    (NoTokenizer, grpc.StatusCode.FAILED_PRECONDITION),
    (Unsupported, grpc.StatusCode.FAILED_PRECONDITION),
    (SessionBusy, grpc.StatusCode.ABORTED),
    (ForkExists, grpc.StatusCode.ALREADY_EXISTS),
    (Exhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (QueueFull, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (CallerQuota, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (PeerCalls, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (Draining, grpc.StatusCode.UNAVAILABLE),
    (Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (Cancelled, grpc.StatusCode.CANCELLED),
    (EngineFault, grpc.StatusCode.INTERNAL),
)


# The ErrorInfo reason of each class (an error may name a more specific one when raised).
REASONS: tuple[tuple[type[BaseException], str], ...] = (
    (InvalidInput, "INVALID_INPUT"),
    (TooLarge, "MESSAGE_TOO_LARGE"),
    (OverCapacity, "CAPACITY_EXCEEDED"),
    (OverLimit, "LIMIT_EXCEEDED"),
    (SessionNotFound, "SESSION_NOT_FOUND"),
    (ModelNotFound, "MODEL_NOT_FOUND"),
    (WrongPod, "WRONG_POD"),
    (NoTokenizer, "NO_TOKENIZER"),
    (Unsupported, "CHAT_TEMPLATE_UNSUPPORTED"),
    (SessionBusy, "SESSION_BUSY"),
    (ForkExists, "FORK_EXISTS"),
    (Exhausted, "SESSIONS_FULL"),
    (QueueFull, "QUEUE_FULL"),
    (CallerQuota, "CALLER_QUOTA"),
    (PeerCalls, "PEER_CALLS"),
    (Draining, "DRAINING"),
    (Unauthenticated, "UNAUTHENTICATED"),
    (Cancelled, "CANCELLED"),
    (EngineFault, "ENGINE_FAULT"),
)
# RetryInfo: how long a client should wait before it tries again, by reason, else by code.
RETRY_SECONDS: dict[str, float] = {"CALLER_QUOTA": 5.0, "DRAINING": 0.1, "MODEL_LOADING": 2.0}
RETRY_CODES: dict[grpc.StatusCode, float] = {
    grpc.StatusCode.RESOURCE_EXHAUSTED: 1.0,
    grpc.StatusCode.UNAVAILABLE: 1.0,
}
FIELD_CODES = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE)
# The HTTP status of each code (the OpenAI-compatible API, service/http/), and of a reason that
# needs a more precise one; anything else is 500.
HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
HTTP_REASON_STATUS: dict[str, int] = {"MESSAGE_TOO_LARGE": 413}


@dataclass(frozen=True)
class Status:
    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, str | bytes], ...] = ()
    reason: str = ""
    field: str = ""  # the request field at fault, "" when none is

    @property
    def retry_seconds(self) -> float | None:
        """How long a client should wait before it tries again (RetryInfo, Retry-After); None: no retry."""
        return RETRY_SECONDS.get(self.reason, RETRY_CODES.get(self.code))

    @property
    def http_status(self) -> int:
        """The status of the same failure on the HTTP API."""
        return HTTP_REASON_STATUS.get(self.reason, HTTP_STATUS.get(self.code, 500))


def status_for(error: BaseException) -> Status:
    """The status a call ends with when `error` escapes its handler, its google.rpc details included."""
    for kind, code in STATUS_TABLE:
        if isinstance(error, kind):
            details = str(error) or kind.__name__
            reason = getattr(error, "reason", "") or _reason(error)
            extra: dict[str, str] = dict(getattr(error, "metadata", {}))
            metadata: tuple[tuple[str, str | bytes], ...] = ()
            if isinstance(error, WrongPod):
                metadata, extra = ((OWNER_METADATA, error.owner),), {**extra, "owner_pod": error.owner}
            field = request_field(getattr(error, "field", ""))
            rich = _details(code, details, reason, field, extra)
            return Status(code, details, (*metadata, (DETAILS_METADATA, rich)), reason, field)
    details = f"internal error: {type(error).__name__}"
    code = grpc.StatusCode.INTERNAL
    rich = _details(code, details, "INTERNAL", "", {})
    return Status(code, details, ((DETAILS_METADATA, rich),), "INTERNAL")


# The engine names a constraint's input at fault by its kind (engine/constrain); the request holds it
# in these fields (the Constraint message's, and the HTTP API's through service/http/openai.param_of).
CONSTRAINT_FIELDS = {
    "json_schema": "constraint.json_schema",
    "regex": "constraint.regex",
    "grammar": "constraint.grammar",
    "choice": "constraint.choice.options",
    "kind": "constraint",
}


def request_field(field: str) -> str:
    """The request field an error's `field` names (the engine's constraint inputs mapped)."""
    return CONSTRAINT_FIELDS.get(field, field)


def _reason(error: BaseException) -> str:
    return next((reason for kind, reason in REASONS if isinstance(error, kind)), "INTERNAL")


def _details(code: grpc.StatusCode, message: str, reason: str, field: str, metadata: dict[str, str]) -> bytes:
    """The serialized google.rpc.Status of a failure: ErrorInfo, then RetryInfo or BadRequest."""
    details: list[Message] = [error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN, metadata=metadata)]
    retry = RETRY_SECONDS.get(reason, RETRY_CODES.get(code))
    if retry is not None:
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(int(retry * 1e9))
        details.append(error_details_pb2.RetryInfo(retry_delay=delay))
    if code in FIELD_CODES:
        violation = error_details_pb2.BadRequest.FieldViolation(
            field=field, description=message, reason=reason
        )
        details.append(error_details_pb2.BadRequest(field_violations=[violation]))
    packed = []
    for detail in details:
        wrapped = any_pb2.Any()
        wrapped.Pack(detail)
        packed.append(wrapped)
    return status_pb2.Status(code=code.value[0], message=message, details=packed).SerializeToString()
