"""The wire between a server's processes: `Link`, length-prefixed frames over a Unix socket, every
item one end sends in an event-loop turn leaving in one frame (so an engine step costs one write for
all the streams it fed, not one per message). Frames are `pickle` dumps (orders
and events are dataclasses): a private format between processes of one installation that trust
each other, never exposed on a port.

Two kinds of links use it. The core's orders (service/core/core_link.py). And each frontend
process's control link (service/processes/frontends.py, service/processes/frontend.py), pickled
items `(kind, serial, payload)`, a request and its answer sharing the serial:
- frontend to server: HELLO (its index, first), then the answers: READY (the port bound, or why
  not), LOADED (the model view is built: "" or why not), DRAINED (calls still in flight when the
  grace ran out), SNAPSHOT (its call metrics and calls in flight);
- server to frontend: SETTINGS (the Config and the port to bind), MODEL (a ModelSpec and the core
  socket's path), DRAIN (the grace), METRICS, and STOP (the grace for calls still there; no answer:
  the process exits).
"""

from __future__ import annotations

import asyncio
import pickle
import struct
from typing import Any

HELLO, READY, LOADED, DRAINED, SNAPSHOT = range(5)  # a frontend's control items
SETTINGS, MODEL, DRAIN, METRICS, STOP = range(10, 15)  # the server's
_HEADER = struct.Struct("<I")
Item = tuple[Any, ...]


class Link:
    """One end of a socket between the server's processes. `send` queues an item; the items of one
    event-loop turn leave as one frame. `receive` gives the next frame's items (None once the other
    end has gone)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self._out: list[Item] = []
        self._loop = asyncio.get_running_loop()

    def send(self, item: Item) -> None:
        if not self._out:
            self._loop.call_soon(self.flush)
        self._out.append(item)

    def flush(self) -> None:
        items, self._out = self._out, []
        if items and not self.writer.is_closing():
            data = pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL)
            self.writer.writelines((_HEADER.pack(len(data)), data))

    async def receive(self) -> list[Item] | None:
        try:
            header = await self.reader.readexactly(_HEADER.size)
            items: list[Item] = pickle.loads(await self.reader.readexactly(_HEADER.unpack(header)[0]))
            return items
        except (asyncio.IncompleteReadError, ConnectionError):
            return None

    def close(self) -> None:
        self.flush()
        self.writer.close()
