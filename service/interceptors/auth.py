"""Who may call: the bearer-token check, the caller's name, and the server's TLS credentials.

With `--auth-tokens`, every Ladder call must carry `authorization: Bearer <token>` naming a known
token (else Unauthenticated: TOKEN_MISSING or TOKEN_UNKNOWN); "name=token" names its caller, a
bare token is named by its hash. Without tokens, under mutual TLS the client certificate's
common name is the caller. The caller (CALLER) scopes sessions and appears in the access log.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import AsyncGenerator, Mapping
from pathlib import Path
from typing import Any

import grpc

from service.config import Config
from service.errors import Unauthenticated
from service.interceptors.base import Context, LadderInterceptor, Stream, Unary
from service.interceptors.call_context import CALLER


def caller_tokens(tokens: tuple[str, ...]) -> dict[str, str]:
    """token -> caller name: "name=token" names its caller, a bare token is named by its hash."""
    named = {}
    for entry in tokens:
        name, eq, token = entry.partition("=")
        if not eq:
            name, token = "token-" + hashlib.sha256(entry.encode()).hexdigest()[:12], entry
        named[token] = name
    return named


TlsMaterial = tuple[bytes, bytes, bytes | None]  # key, certificate, client CA (mutual TLS)


def tls_material(config: Config) -> TlsMaterial | None:
    """The key, certificate and client CA the server's TLS is made of (None without TLS)."""
    if not config.tls:
        return None
    ca = Path(config.tls_client_ca).read_bytes() if config.tls_client_ca else None
    return Path(config.tls_key).read_bytes(), Path(config.tls_cert).read_bytes(), ca


def credentials(material: TlsMaterial | None) -> grpc.ServerCredentials | None:
    """TLS from the key and certificate; a client CA makes it mutual TLS."""
    if material is None:
        return None
    key, cert, ca = material
    mutual = ca is not None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=mutual)


def server_credentials(config: Config) -> grpc.ServerCredentials | None:
    """TLS from the certificate and key; a client CA makes it mutual TLS."""
    return credentials(tls_material(config))


def _certificate_name(context: Context) -> str:
    """Under mutual TLS without tokens, the client certificate's common name is the caller."""
    name = next(iter((context.auth_context() or {}).get("x509_common_name") or ()), None)
    return "cn:" + name.decode() if name is not None else ""


class Authentication(LadderInterceptor):
    def __init__(self, tokens: tuple[str, ...]) -> None:
        self.tokens = caller_tokens(tokens)

    def _name_caller(self, context: Context) -> None:
        metadata: Mapping[str, str | bytes] = dict(context.invocation_metadata() or ())
        CALLER.set(self.caller(metadata) or _certificate_name(context))

    def caller(self, metadata: Mapping[str, str | bytes]) -> str:
        """The caller its `authorization` names ("" without tokens); Unauthenticated when none is known.
        gRPC's metadata, or the HTTP API's headers."""
        if not self.tokens:
            return ""
        header = str(metadata.get("authorization", ""))
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise Unauthenticated(
                "missing bearer token (metadata authorization: Bearer <token>)", reason="TOKEN_MISSING"
            )
        for known, name in self.tokens.items():
            if hmac.compare_digest(known.encode(), token.strip().encode()):
                return name
        raise Unauthenticated("unknown bearer token", reason="TOKEN_UNKNOWN")

    def unary(self, name: str, behavior: Unary) -> Unary:
        async def unary(request: Any, context: Context) -> Any:
            self._name_caller(context)
            return await behavior(request, context)

        return unary

    def stream(self, name: str, behavior: Stream) -> Stream:
        async def stream(request: Any, context: Context) -> AsyncGenerator[Any, None]:
            responses = behavior(request, context)
            try:
                self._name_caller(context)
                async for response in responses:
                    yield response
            finally:
                await responses.aclose()

        return stream
