"""The gRPC frontend processes (`--frontends N`) as the server starts, watches and stops them.

`Frontends.start` opens the relay socket, starts each frontend (service/frontend.py) and tells it
its settings and the methods to relay (`Methods`, collected as a grpc.aio server would); the
first binds the port, the others share what it bound. Each frontend's link is then served by a
`relay.Connection`, whose calls run through the interceptors as grpc.aio runs them (`resolve`).
The wire and the calls themselves: service/relay.py.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import structlog

from service.exiting import EXIT_WITHIN_S
from service.relay import HELLO, SETTINGS, STOP, Connection, Details, Link

if TYPE_CHECKING:
    from service.relay import Handler

log = structlog.get_logger("ladder.relay")
START_TIMEOUT_S = 60.0  # a frontend's start: its interpreter, imports and bind
# A stopping frontend gets its calls' grace and this much more, then is killed: well inside the
# serve process's own bound (the watchdog ends it at grace + EXIT_WITHIN_S - its margin).
STOP_AFTER_GRACE_S = EXIT_WITHIN_S - 3.0


class Methods:
    """Stands in for a grpc.aio server to collect the handlers the generated code registers on it."""

    def __init__(self) -> None:
        self.handlers: dict[str, Handler] = {}

    def add_generic_rpc_handlers(self, handlers: Sequence[Any]) -> None:
        pass  # every service registered here also registers its methods by name (below)

    def add_registered_method_handlers(self, service: str, methods: dict[str, Handler]) -> None:
        self.handlers.update({f"/{service}/{name}": handler for name, handler in methods.items()})

    def table(self) -> list[tuple[str, bool, bool]]:
        """(method, request streaming, response streaming): what a frontend needs to relay each."""
        return [(name, h.request_streaming, h.response_streaming) for name, h in self.handlers.items()]


# A frontend's interpreter starts from this, with the directory holding the `service` package first
# on its path (it is not always the working directory) and the socket and its index as arguments.
_BOOT = "import sys; sys.path.insert(0, {root!r}); from service.frontend import main; main(sys.argv[1:])"


class Frontends:
    """The frontend processes and this process's end of their links: start, watch, stop.

    `settings` is what every frontend is told (service/frontend.py: address, TLS material, message
    limits, log level); `interceptors` run around every relayed call, outermost first, as grpc.aio
    runs them; `on_lost` hears of a frontend that exited while the server was serving."""

    def __init__(
        self,
        count: int,
        methods: Methods,
        interceptors: Sequence[grpc.aio.ServerInterceptor],
        settings: dict[str, Any],
        on_lost: Callable[[BaseException], None],
    ) -> None:
        self.count, self.methods, self.interceptors = count, methods, tuple(interceptors)
        self.settings, self.on_lost = settings, on_lost
        self.processes: list[asyncio.subprocess.Process] = []
        self._connections: list[Connection] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._waiting: dict[int, tuple[int, asyncio.Future[tuple[int, str]]]] = {}
        self._dir = ""
        self._server: asyncio.AbstractServer | None = None
        self._stopping = False

    async def resolve(self, details: Details) -> Handler | None:
        """The handler of a call, wrapped by the interceptors as grpc.aio wraps it."""

        async def at(index: int, details: Any) -> Handler | None:
            if index == len(self.interceptors):
                return self.methods.handlers.get(details.method)
            handler: Handler | None = await self.interceptors[index].intercept_service(
                lambda inner: at(index + 1, inner), details
            )
            return handler

        return await at(0, details)

    async def start(self, port: int) -> int:
        """Start the frontends (the first binds `port`, 0: a free one; the others share what it bound);
        returns the port. PortInUse when the first cannot bind it."""
        from service.ports import PortInUse

        self._dir = tempfile.mkdtemp(prefix="ladder-relay-")
        path = str(Path(self._dir) / "relay.sock")
        self._server = await asyncio.start_unix_server(self._connected, path)
        for index in range(self.count):
            bound, error = await self._spawn(path, index, port)
            if error:
                raise PortInUse(
                    f"gRPC port (--port/LADDER_PORT) {port} could not be bound by frontend {index}: {error}"
                )
            port = bound
        for index, process in enumerate(self.processes):
            self._watch(asyncio.create_task(self._exited(index, process)))
        return port

    async def _spawn(self, path: str, index: int, port: int) -> tuple[int, str]:
        ready: asyncio.Future[tuple[int, str]] = asyncio.get_running_loop().create_future()
        self._waiting[index] = (port, ready)
        root = str(Path(__file__).resolve().parent.parent)
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _BOOT.format(root=root), path, str(index), stdin=asyncio.subprocess.DEVNULL
        )
        self.processes.append(process)
        exited = asyncio.create_task(process.wait())
        await asyncio.wait((ready, exited), timeout=START_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        exited.cancel()
        if not ready.done():
            ready.cancel()
            code = process.returncode
            state = f"exited with code {code}" if code is not None else "timed out"
            raise RuntimeError(f"gRPC frontend {index} {state} before it listened")
        return ready.result()

    def _watch(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = Link(reader, writer)
        hello = await link.receive()
        if not hello or hello[0][0] != HELLO or hello[0][1] not in self._waiting:
            link.close()
            return
        port, ready = self._waiting.pop(hello[0][1])
        link.send((SETTINGS, {**self.settings, "port": port, "index": hello[0][1]}, self.methods.table()))
        answer = await link.receive()
        bound, error = (answer[0][1], answer[0][2]) if answer else (0, "it closed its link")
        if not ready.done():
            ready.set_result((bound, error))
        if error:
            link.close()
            return
        connection = Connection(link, self.resolve)
        self._connections.append(connection)
        self._watch(asyncio.create_task(connection.serve()))

    def relayed(self) -> list[int]:
        """How many calls each frontend has relayed so far."""
        return [connection.started for connection in self._connections]

    async def _exited(self, index: int, process: asyncio.subprocess.Process) -> None:
        code = await process.wait()
        if not self._stopping:
            self.on_lost(RuntimeError(f"gRPC frontend {index} exited with code {code}"))

    async def stop(self, grace: float) -> None:
        """Tell every frontend to stop (calls there get `grace` seconds), wait for them, then close."""
        self._stopping = True
        for connection in self._connections:
            connection.link.send((STOP, grace))
            connection.link.flush()
        waits = [asyncio.create_task(p.wait()) for p in self.processes if p.returncode is None]
        if waits:
            await asyncio.wait(waits, timeout=grace + STOP_AFTER_GRACE_S)
        for process in self.processes:
            if process.returncode is None:
                log.warning("frontend_killed", pid=process.pid)
                process.kill()
                await process.wait()
        for connection in self._connections:
            connection.link.close()
        for task in list(self._tasks):
            task.cancel()
        if self._server is not None:
            self._server.close()
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
