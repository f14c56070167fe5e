"""The one interceptor every Ladder call passes through, and the server's TLS credentials.

It checks the bearer token (when tokens are configured), names the caller and
the request (x-request-id) for the handler and the logs, refuses new work while
draining, and turns whatever a handler raises into its status through the table
in service/errors.py. Health and reflection pass untouched: probes carry no token.
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import grpc
import structlog

from service.config import Config
from service.errors import Unauthenticated, status_for

log = structlog.get_logger("ladder.rpc")
CALLER: contextvars.ContextVar[str] = contextvars.ContextVar("ladder_caller", default="")
REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("ladder_request_id", default="")
LADDER_PREFIX = "/ladder.v1.Ladder/"


def caller_tokens(tokens: tuple[str, ...]) -> dict[str, str]:
    """token -> caller name: "name=token" names its caller, a bare token is named by its hash."""
    named = {}
    for entry in tokens:
        name, eq, token = entry.partition("=")
        if not eq:
            name, token = "token-" + hashlib.sha256(entry.encode()).hexdigest()[:12], entry
        named[token] = name
    return named


def server_credentials(config: Config) -> grpc.ServerCredentials | None:
    """TLS from the certificate and key; a client CA makes it mutual TLS."""
    if not config.tls:
        return None
    pair = (Path(config.tls_key).read_bytes(), Path(config.tls_cert).read_bytes())
    ca = Path(config.tls_client_ca).read_bytes() if config.tls_client_ca else None
    return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=ca is not None)


def _certificate_name(context: grpc.aio.ServicerContext) -> str:
    """Under mutual TLS without tokens, the client certificate's common name is the caller."""
    names = (context.auth_context() or {}).get("x509_common_name") or []
    return "cn:" + names[0].decode() if names else ""


class CallInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, tokens: tuple[str, ...], gate: Callable[[], None],
                 on_done: Callable[[str, grpc.StatusCode, float], None]) -> None:
        self.tokens = caller_tokens(tokens)
        self.gate = gate  # raises (Draining) while the server takes no new work
        self.on_done = on_done
        self.in_flight = 0

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        method = details.method
        if handler is None or not method.startswith(LADDER_PREFIX):
            return handler
        name = method.removeprefix(LADDER_PREFIX)
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=self._unary(name, handler.unary_unary))
        if handler.unary_stream is not None:
            return handler._replace(unary_stream=self._stream(name, handler.unary_stream))
        return handler._replace(stream_stream=self._stream(name, handler.stream_stream))

    def _enter(self, name: str, context: grpc.aio.ServicerContext) -> float:
        metadata: Mapping[str, str | bytes] = dict(context.invocation_metadata() or ())
        request_id = str(metadata.get("x-request-id") or uuid.uuid4().hex[:16])
        REQUEST_ID.set(request_id)
        structlog.contextvars.bind_contextvars(request_id=request_id, method=name)
        context.set_trailing_metadata((("x-request-id", request_id),))
        self.gate()
        CALLER.set(self._caller(metadata) or _certificate_name(context))
        return time.perf_counter()

    def _caller(self, metadata: Mapping[str, str | bytes]) -> str:
        if not self.tokens:
            return ""
        header = str(metadata.get("authorization", ""))
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated("missing bearer token (metadata authorization: Bearer <token>)")
        for known, name in self.tokens.items():
            if hmac.compare_digest(known.encode(), token.strip().encode()):
                return name
        raise Unauthenticated("unknown bearer token")

    async def _fail(self, name: str, context: grpc.aio.ServicerContext, error: BaseException,
                    started: float) -> None:
        status = status_for(error)
        self._done(name, status.code, started)
        log_call = log.error if status.code == grpc.StatusCode.INTERNAL else log.info
        log_call("rpc_failed", code=status.code.name, details=status.details)
        metadata = (("x-request-id", REQUEST_ID.get()), *status.trailing_metadata)
        await context.abort(status.code, status.details, metadata)

    def _done(self, name: str, code: grpc.StatusCode, started: float) -> None:
        self.on_done(name, code, time.perf_counter() - started)

    def _unary(self, name: str, behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            started = time.perf_counter()
            self.in_flight += 1
            try:
                started = self._enter(name, context)
                response = await behavior(request, context)
            except grpc.aio.AbortError:
                raise
            except Exception as exc:  # noqa: BLE001 — every failure goes through the table
                await self._fail(name, context, exc, started)
            finally:
                self.in_flight -= 1
            self._done(name, grpc.StatusCode.OK, started)
            return response

        return unary

    def _stream(self, name: str,
                behavior: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            started = time.perf_counter()
            self.in_flight += 1
            try:
                started = self._enter(name, context)
                async for response in behavior(request, context):
                    yield response
            except grpc.aio.AbortError:
                raise
            except Exception as exc:  # noqa: BLE001 — every failure goes through the table
                await self._fail(name, context, exc, started)
            else:
                self._done(name, grpc.StatusCode.OK, started)
            finally:
                self.in_flight -= 1

        return stream
