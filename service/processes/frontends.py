"""The gRPC frontend processes (`--frontends N`) as the server's process starts, feeds, watches and
stops them.

`Frontends.start` opens the control socket, starts each frontend (service/processes/frontend.py) and tells it
the Config and the port; the first binds it, the others share what it bound. Once the model has
loaded, `serve_core` opens the core socket, where each frontend's RemoteCore is answered by a
`CoreServer` on this process's Core (service/core/core_link.py), and tells every frontend the model's
spec: each reads the tokenizer and turns SERVING. `drain` drains them all, `stop` stops them.
`families_now` is what the metrics registry asks when scraped: every frontend's call metrics.
A frontend that exits while the server serves is reported to `on_lost` (the server drains and exits).
The wire: service/relay.py.
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
from google.protobuf.internal import api_implementation

from service import relay
from service.config import Config, child_environment
from service.core.core import Core
from service.core.core_link import CoreServer, core_link
from service.exiting import EXIT_WITHIN_S
from service.merged_metrics import Families
from service.ports import PortInUse
from service.relay import Link
from service.served_model import ModelSpec

log = structlog.get_logger("ladder.frontends")
START_TIMEOUT_S = 60.0  # a frontend's start: its interpreter, imports and bind; its tokenizer read
ASK_TIMEOUT_S = 5.0  # a frontend's answer to METRICS
# A stopping frontend gets its calls' grace and this much more, then is killed: well inside the
# serve process's own bound (the watchdog ends it at grace + EXIT_WITHIN_S - its margin).
STOP_AFTER_GRACE_S = EXIT_WITHIN_S - 3.0

# A frontend's interpreter starts from this, with the directory holding the `service` package first
# on its path (it is not always the working directory) and the socket and its index as arguments.
_BOOT = (
    "import sys; sys.path.insert(0, {root!r}); "
    "from service.processes.frontend import main; main(sys.argv[1:])"
)


class FrontendGone(ConnectionError):
    """A frontend's control link ended before it answered."""


class _Control:
    """This process's end of one frontend's control link: items sent, answers awaited by serial."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self._answers: dict[int, asyncio.Future[Any]] = {}
        self._serials = itertools.count(1)
        self.gone = False

    async def ask(self, kind: int, payload: Any, timeout: float) -> Any:
        if self.gone:
            raise FrontendGone("the frontend's link has ended")
        serial = next(self._serials)
        answer = self._answers[serial] = asyncio.get_running_loop().create_future()
        self.link.send((kind, serial, payload))
        try:
            return await asyncio.wait_for(answer, timeout)
        finally:
            self._answers.pop(serial, None)

    async def run(self) -> None:
        try:
            while (items := await self.link.receive()) is not None:
                for _, serial, payload in items:
                    answer = self._answers.get(serial)
                    if answer is not None and not answer.done():
                        answer.set_result(payload)
        finally:
            self.gone = True
            for answer in self._answers.values():
                if not answer.done():
                    answer.set_exception(FrontendGone("the frontend's link ended"))


class Frontends:
    """The frontend processes and this process's ends of their links: start, feed, watch, stop."""

    def __init__(self, config: Config, on_lost: Callable[[BaseException], None]) -> None:
        self.config, self.count, self.on_lost = config, config.frontend_processes, on_lost
        self.processes: list[asyncio.subprocess.Process] = []
        self._controls: list[_Control] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._dir = ""
        self._servers: list[asyncio.AbstractServer] = []
        self._core: Core | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self.last_families: list[Families] = []

    async def start(self, port: int) -> int:
        """Start the frontends (the first binds `port`, 0: a free one; the others share what it bound);
        returns the port. PortInUse when the first cannot bind it."""
        self._loop = asyncio.get_running_loop()
        self._dir = tempfile.mkdtemp(prefix="ladder-frontends-")
        path = str(Path(self._dir) / "control.sock")
        hellos: asyncio.Queue[tuple[int, Link]] = asyncio.Queue()

        async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            link = Link(reader, writer)
            hello = await link.receive()
            if hello and hello[0][0] == relay.HELLO:
                hellos.put_nowait((hello[0][2], link))
            else:
                link.close()

        self._servers.append(await asyncio.start_unix_server(connected, path))
        for index in range(self.count):
            port = await self._spawn(path, index, port, hellos)
        for index, process in enumerate(self.processes):
            self._watch(asyncio.create_task(self._exited(index, process)))
        return port

    async def _spawn(self, path: str, index: int, port: int, hellos: asyncio.Queue[tuple[int, Link]]) -> int:
        root = str(Path(__file__).resolve().parents[2])  # the directory holding the service package
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _BOOT.format(root=root),
            path,
            str(index),
            stdin=asyncio.subprocess.DEVNULL,
            env=child_environment(api_implementation.Type()),
        )
        self.processes.append(process)
        exited = asyncio.create_task(process.wait())
        hello = asyncio.create_task(hellos.get())
        await asyncio.wait((hello, exited), timeout=START_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        exited.cancel()
        if not hello.done():
            hello.cancel()
            code = process.returncode
            state = f"exited with code {code}" if code is not None else "timed out"
            raise RuntimeError(f"gRPC frontend {index} {state} before it listened")
        _, link = hello.result()
        control = _Control(link)
        self._controls.append(control)
        self._watch(asyncio.create_task(control.run()))
        bound, error = await control.ask(relay.SETTINGS, (self.config, port), START_TIMEOUT_S)
        if error:
            raise PortInUse(
                f"gRPC port (--port/LADDER_PORT) {port} could not be bound by frontend {index}: {error}"
            )
        return int(bound)

    async def serve_core(self, core: Core, spec: ModelSpec) -> None:
        """Open the core socket for `core` and tell every frontend the model: once this returns, each
        has its model view and its link to the core, and serves."""
        self._core = core
        path = str(Path(self._dir) / "core.sock")
        self._servers.append(await asyncio.start_unix_server(self._core_connected, path))
        answers = await asyncio.gather(
            *(control.ask(relay.MODEL, (spec, path), START_TIMEOUT_S) for control in self._controls)
        )
        failed = [(index, error) for index, error in enumerate(answers) if error]
        if failed:
            index, error = failed[0]
            raise RuntimeError(f"gRPC frontend {index} could not serve the model: {error}")

    def _core_connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._core is not None
        self._watch(asyncio.create_task(CoreServer(self._core, core_link(reader, writer)).serve()))

    async def drain(self, grace: float) -> int:
        """Drain every frontend (new calls refused, health NOT_SERVING, `grace` for the calls in
        flight); the calls still in flight there when the grace ran out."""
        answers = await asyncio.gather(
            *(control.ask(relay.DRAIN, grace, grace + ASK_TIMEOUT_S) for control in self._controls),
            return_exceptions=True,
        )
        return sum(answer for answer in answers if isinstance(answer, int))

    async def snapshots(self) -> list[tuple[Families, int]]:
        """Every frontend's call metrics and calls in flight now (a frontend that does not answer:
        none)."""
        answers = await asyncio.gather(
            *(control.ask(relay.METRICS, None, ASK_TIMEOUT_S) for control in self._controls),
            return_exceptions=True,
        )
        return [answer for answer in answers if isinstance(answer, tuple)]

    def families_now(self) -> list[Families]:
        """The frontends' call metrics, for a scrape on any thread but the event loop's (there, and
        once the loop has stopped, the last ones asked for)."""
        loop = self._loop
        if loop is None or loop.is_closed() or not loop.is_running() or _on_loop(loop):
            return self.last_families
        try:
            snapshots = asyncio.run_coroutine_threadsafe(self.snapshots(), loop).result(ASK_TIMEOUT_S + 1)
        except Exception:  # noqa: BLE001 — a scrape during the stop: what was seen last
            return self.last_families
        self.last_families = [families for families, _ in snapshots]
        return self.last_families

    def _watch(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _exited(self, index: int, process: asyncio.subprocess.Process) -> None:
        code = await process.wait()
        if not self._stopping:
            self.on_lost(RuntimeError(f"gRPC frontend {index} exited with code {code}"))

    async def stop(self, grace: float) -> None:
        """Tell every frontend to stop (calls there get `grace` seconds), wait for them, then close."""
        self._stopping = True
        self.last_families = [families for families, _ in await self.snapshots()] or self.last_families
        for control in self._controls:
            control.link.send((relay.STOP, 0, grace))
            control.link.flush()
        waits = [asyncio.create_task(p.wait()) for p in self.processes if p.returncode is None]
        if waits:
            await asyncio.wait(waits, timeout=grace + STOP_AFTER_GRACE_S)
        for process in self.processes:
            if process.returncode is None:
                log.warning("frontend_killed", pid=process.pid)
                process.kill()
                await process.wait()
        for control in self._controls:
            control.link.close()
        for task in list(self._tasks):
            task.cancel()
        for server in self._servers:
            server.close()
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
