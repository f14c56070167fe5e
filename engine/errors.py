"""The engine's two kinds of failure: a request's fault, and the engine's own.

Request errors fail one call and leave every other session untouched; the
service maps each class to one gRPC status in one table. An EngineFault
means the executor can no longer be trusted: the service flips health and drains.
"""


class EngineError(Exception):
    """Base of everything the engine raises on purpose."""


class RequestError(EngineError):
    """The request is at fault; nothing else is affected."""


class InvalidInput(RequestError):
    """Malformed input: empty prompt, token id out of the vocabulary, bad port shape."""


class OutOfRange(RequestError):
    """The prompt (plus what it asks to generate) does not fit in the KV capacity."""


class Unsupported(RequestError):
    """The model cannot do what the request asks (its chat template does not compile)."""


class Exhausted(RequestError):
    """No KV slot (session) is free."""


class EngineFault(EngineError):
    """The runtime failed in a way that may have corrupted shared state."""
