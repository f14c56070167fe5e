"""The bearer-token check on gRPC (service/door/callers.py) and the gRPC server's TLS credentials.

Without tokens, under mutual TLS the client certificate's common name is the caller.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import Any

import grpc

from service.config import Config
from service.door.call_context import CALLER
from service.door.callers import Callers, TlsMaterial, tls_material
from service.interceptors.base import Context, LadderInterceptor, Stream, Unary


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
        self.callers = Callers(tokens)

    def _name_caller(self, context: Context) -> None:
        metadata: Mapping[str, str | bytes] = dict(context.invocation_metadata() or ())
        CALLER.set(self.callers.caller(metadata) or _certificate_name(context))

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
