"""Who may call: the bearer-token check and the caller's name, for gRPC's metadata and HTTP's
headers alike, and the TLS material both listeners are made of.

With `--auth-tokens`, every Ladder call must carry `authorization: Bearer <token>` naming a known
token (else Unauthenticated: TOKEN_MISSING or TOKEN_UNKNOWN); "name=token" names its caller, a
bare token is named by its hash. Without tokens, under mutual TLS the client certificate's
common name is the caller (each protocol reads it from its own connection). The caller (CALLER)
scopes sessions and appears in the access log.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from pathlib import Path

from service.config import Config
from service.errors import Unauthenticated


def caller_tokens(tokens: tuple[str, ...]) -> dict[str, str]:
    """token -> caller name: "name=token" names its caller, a bare token is named by its hash."""
    named = {}
    for entry in tokens:
        name, eq, token = entry.partition("=")
        if not eq:
            name, token = "token-" + hashlib.sha256(entry.encode()).hexdigest()[:12], entry
        named[token] = name
    return named


class Callers:
    """The known bearer tokens and the callers they name."""

    def __init__(self, tokens: tuple[str, ...]) -> None:
        self.tokens = caller_tokens(tokens)

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


TlsMaterial = tuple[bytes, bytes, bytes | None]  # key, certificate, client CA (mutual TLS)


def tls_material(config: Config) -> TlsMaterial | None:
    """The key, certificate and client CA the server's TLS is made of (None without TLS)."""
    if not config.tls:
        return None
    ca = Path(config.tls_client_ca).read_bytes() if config.tls_client_ca else None
    return Path(config.tls_key).read_bytes(), Path(config.tls_cert).read_bytes(), ca
