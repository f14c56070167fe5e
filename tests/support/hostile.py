"""Hostile clients for tests: raw sockets that connect and stall, and the checks that a server got over it.

`stalled(port, n)` opens `n` TCP connections (optionally sending a prefix, a byte at a time or all at
once; from one address or several) and keeps them until the block ends; `closed_by_peer` tells
which the server has closed; `server_answers` is what every hostile test asks afterwards: gRPC
health within a second, a Generate, and HTTP /health when the server has the HTTP API.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import resource
import socket
import time
from collections.abc import Iterator
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.prompts import greedy_request, prompt_ids

# HTTP/2's client preface and an empty SETTINGS frame: what a gRPC client sends first.
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
HEALTH_WITHIN_S = 1.0


def raise_file_limit(at_least: int) -> None:
    """This test process may hold `at_least` descriptors (up to the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = at_least if hard == resource.RLIM_INFINITY else min(at_least, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


@contextlib.contextmanager
def stalled(port: int, count: int, sent: bytes = b"", peers: int = 1) -> Iterator[list[socket.socket]]:
    """`count` connections to 127.0.0.1:`port` that send `sent` and then nothing; closed at the end.
    They come from `peers` addresses other than 127.0.0.1 in turn when `peers` > 1 (127.0.0.2, …:
    Linux routes all of 127/8 to loopback), so probes from 127.0.0.1 are another client."""
    raise_file_limit(count + 512)
    sources = [("127.0.0.1", 0)] if peers == 1 else [(f"127.0.0.{2 + i}", 0) for i in range(peers)]
    sockets: list[socket.socket] = []
    try:
        for i in range(count):
            sock = socket.create_connection(("127.0.0.1", port), 10, source_address=sources[i % peers])
            if sent:
                sock.sendall(sent)
            sockets.append(sock)
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def closed_by_peer(sock: socket.socket) -> bool:
    """Whether the server has closed `sock` (what it sent before is read and dropped)."""
    sock.setblocking(False)
    try:
        while chunk := sock.recv(65536):
            del chunk
        return True
    except BlockingIOError:
        return False
    except OSError:  # reset
        return True
    finally:
        sock.setblocking(True)


def count_closed(sockets: list[socket.socket], at_least: int, within_s: float) -> int:
    """How many of `sockets` the server has closed, once `at_least` are or `within_s` has passed."""
    deadline = time.monotonic() + within_s
    closed: set[int] = set()
    while True:
        closed |= {i for i, sock in enumerate(sockets) if i not in closed and closed_by_peer(sock)}
        if len(closed) >= at_least or time.monotonic() > deadline:
            return len(closed)
        time.sleep(0.05)


def health_seconds(address: str) -> float:
    """Seconds a gRPC health check on a new channel takes to answer SERVING (fails past 1 s)."""
    with grpc.insecure_channel(address) as channel:
        started = time.perf_counter()
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=HEALTH_WITHIN_S
        )
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        return time.perf_counter() - started


def http_status(
    port: int, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> int:
    """The status of one HTTP request to 127.0.0.1:`port` on a connection of its own."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.putrequest(method, path, skip_accept_encoding=True)
        for name, value in {"Content-Length": str(len(body or b"")), **(headers or {})}.items():
            connection.putheader(name, value)
        connection.endheaders(body)
        return connection.getresponse().status
    finally:
        connection.close()


def server_answers(address: str, http_port: int = 0) -> None:
    """The server got over it: gRPC health within a second, a Generate, HTTP /health (when served)."""
    from proto.ladder.v1 import ladder_pb2_grpc

    assert health_seconds(address) < HEALTH_WITHIN_S
    with grpc.insecure_channel(address) as channel:
        answer = ladder_pb2_grpc.LadderStub(channel).Generate(greedy_request(prompt_ids(5), 3), timeout=30)
        assert len(answer.token_ids) == 3
    if http_port:
        assert http_status(http_port, "GET", "/health") == 200


WORDS = 400  # an enum each level's "p" merges with a type: each use costs ~2 ms to compile


def fanned_schema(
    depth: int = 30, title: str = "", beside: bool = True, width: int = 2, words: int = WORDS
) -> str:
    """`depth` levels of objects, each with `width` members ("a", "b", ...) that $ref the next
    level, and a member "p" (one of `words` strings) that costs a little to compile; `title` (an
    annotation) makes the text, so the cache key, differ. A keyword `beside`
    each $ref (one that holds for every object) makes each use a schema of its own, merged with its
    target, so the subschemas multiply at every level; a $ref alone is compiled once however often
    it is used."""
    more = {"minProperties": 0} if beside else {}
    defs: dict[str, Any] = {
        f"n{i}": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                **{chr(97 + k): {"$ref": f"#/$defs/n{i + 1}", **more} for k in range(width)},
                "p": {"$ref": "#/$defs/words", "type": "string"},
            },
        }
        for i in range(depth)
    }
    defs[f"n{depth}"] = {"type": "integer"}
    defs["words"] = {"enum": [f"w{i}" for i in range(words)]}
    return json.dumps({"title": title, "$defs": defs, "$ref": "#/$defs/n0"})
