"""The engine's kinds of failure: a request's fault, a model directory's, and the engine's own.

Request errors fail one call and leave every other session untouched; the
service maps each class to one gRPC status in one table (service/errors.py),
and raises the same classes for what it finds wrong in a request before the
engine sees it. A ModelUnreadable is found at start-up, never in a call: the
server says why in one line and exits. An EngineFault means the executor can
no longer be trusted: the service flips health and drains.
"""


class EngineError(Exception):
    """Base of everything the engine raises on purpose."""


class RequestError(EngineError):
    """The request is at fault; nothing else is affected.

    `reason` names the case in the status details (default: the class's own), `field` the
    request field at fault ("" when none is, or the engine cannot tell)."""

    def __init__(self, *args: object, reason: str = "", field: str = "") -> None:
        super().__init__(*args)
        self.reason = reason
        self.field = field


class InvalidInput(RequestError):
    """Malformed input: empty prompt, token id out of the vocabulary, bad sampling values, bad port shape."""


class OverCapacity(RequestError):
    """The prompt (plus what it asks to generate) does not fit in the KV capacity."""


class Unsupported(RequestError):
    """The model cannot do what the request asks (its chat template does not compile)."""


class Exhausted(RequestError):
    """No KV slot (session) is free."""


class ParkingFull(Exhausted):
    """Every KV slot is taken and parking a session off one would put the parked sessions past the
    memory they may hold (`Engine.limit_parked`)."""


class NoFreeRow(Exhausted):
    """Every KV slot holds a session in use right now: a parked session waits for one (the
    scheduler retries the request next round instead of failing it)."""


class ModelUnreadable(EngineError):
    """The model directory is not one Ladder can serve (no genai_config.json, missing ports)."""


class EngineFault(EngineError):
    """The runtime failed in a way that may have corrupted shared state."""
