"""One process's gRPC server (GrpcDoor): Ladder, grpc.health.v1 and reflection on grpc.aio, behind
the interceptors (service/interceptors/). The server's process runs one when it serves gRPC itself;
with `--frontends N` each frontend process runs one (service/processes/frontend.py) and the server's process
none. Either way the handlers are the servicer's, on a Front (service/front/front.py), and grpc.aio hands
them its own servicer context: nothing imitates it.

The drain is the door's: new calls are refused (the gate), health says NOT_SERVING, and the calls in
flight get the grace to finish; `drain` says how many had not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from service.config import Config
from service.front.front import Front
from service.grpc.parsing import SERVICE_NAME, add_ladder_service
from service.grpc.reflection import enable as documented_reflection
from service.grpc.servicer import LadderServicer
from service.interceptors import chain
from service.interceptors.access_log import AccessLog
from service.interceptors.auth import server_credentials
from service.interceptors.peer_calls import PeerCallLimit
from service.metrics import Metrics
from service.ports import GRPC_PORT, ConnectionLimits, PortInUse, server_options

HEALTH_NAMES = ("", SERVICE_NAME)


class GrpcDoor:
    """A grpc.aio server with Ladder, health and reflection. `gate` refuses a call before any handler
    runs (draining, or no model yet); `front` is what the handlers work on once it lets them."""

    def __init__(
        self,
        config: Config,
        metrics: Metrics,
        access_log: AccessLog,
        gate: Callable[[], None],
        front: Callable[[], Front],
        share_port: bool = False,
    ) -> None:
        self.config, self.access_log = config, access_log
        self.health = health.aio.HealthServicer()
        peer_calls = PeerCallLimit(
            config.max_calls_per_peer, lambda: metrics.connection_refused("grpc", "calls_per_peer")
        )
        interceptors = chain(access_log, gate, config.auth_tokens, peer_calls=peer_calls)
        options = server_options(config.max_message_bytes, ConnectionLimits.of(config), share_port=share_port)
        self.server = grpc.aio.server(interceptors=interceptors, options=options)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        add_ladder_service(LadderServicer(front), self.server, config.max_message_bytes)
        documented_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), self.server)

    async def start(self, port: int) -> int:
        """Bind `port` on the configured host (0: a free one) with the configured TLS, health
        NOT_SERVING; the port bound. PortInUse when it cannot be bound."""
        address = f"{self.config.host}:{port}"
        tls = server_credentials(self.config)
        try:
            bound = (
                self.server.add_secure_port(address, tls) if tls else self.server.add_insecure_port(address)
            )
        except RuntimeError as exc:  # taken between the check and the bind, or held by another process
            raise PortInUse(f"{GRPC_PORT} {port} on {self.config.host} could not be bound: {exc}") from None
        await self.set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.start()
        return bound

    async def set_health(self, status: Any) -> None:
        for name in HEALTH_NAMES:
            await self.health.set(name, status)

    async def drain(self, grace: float) -> int:
        """Health NOT_SERVING for good, then wait up to `grace` seconds for the calls in flight (the
        caller's gate refuses new ones already); how many are still in flight."""
        await self.health.enter_graceful_shutdown()
        return await self.access_log.settled(grace)

    async def stop(self, grace: float) -> None:
        await self.server.stop(grace)
