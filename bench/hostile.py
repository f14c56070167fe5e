"""Hostile load against a running server (issue #39's "done when"), with a health probe throughout.

At once: 10,000 HTTP requests to unknown routes or with wrong methods, 100 bodies nested 100,000
deep, 2,000 slowloris connections (half on the gRPC port trickling the HTTP/2 preface, half on the
HTTP port trickling headers, a byte a second), and 20 Generate calls with a hostile JSON Schema
(30 levels deep, ~3.4 KB) and 2 s deadlines; meanwhile a probe checks gRPC health on a new
channel every 100 ms. Prints (and with --out writes) one JSON summary: HTTP answers by status,
Generate codes, health latency p50/p99/max and failures, slowloris connections the server closed,
whether the server still answers, and the refusal counters from /metrics.

    python -m bench.hostile --grpc 127.0.0.1:50051 --http 127.0.0.1:8000 --metrics 127.0.0.1:9464
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proto.ladder.v1 import ladder_pb2 as pb
from proto.ladder.v1 import ladder_pb2_grpc

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
SLOW_HEADERS = b"GET /health HTTP/1.1\r\nHost: ladder\r\nX-Slow: " + b"a" * 4000 + b"\r\n\r\n"
METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE")
PATHS = (
    "/nope",
    "/v1/completions/",
    "/v1/../v1/models",
    "/v1/%ff%fe",
    "/v1/models",
    "/v1/completions",
    "/" + "x" * 2000,
    "/v1/chat/completions",
    "/health/",
)
NESTED = b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
METRICS = (
    "ladder_connections_refused_total",
    "ladder_connections_timed_out_total",
    "process_open_fds",
    "process_max_fds",
)


def hostile_schema(depth: int = 30) -> dict[str, Any]:
    """Objects nested `depth` deep, each with an anyOf of patterns and numbers beside the next level."""
    schema: dict[str, Any] = {"type": "string", "pattern": "[a-z]{1,9}"}
    for level in range(depth):
        choice = {"anyOf": [{"type": "string", "pattern": f"[a-{'bcdef'[level % 5]}]+"}, {"type": "integer"}]}
        schema = {"type": "object", "properties": {"n": schema, "v": choice}}
    return schema


class Probe(threading.Thread):
    """gRPC health on a new channel every `period` s: latencies, and failures by code."""

    def __init__(self, address: str, period: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.address, self.period = address, period
        self.seconds: list[float] = []
        self.failures: Counter[str] = Counter()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(self.period):
            with grpc.insecure_channel(self.address) as channel:
                started = time.perf_counter()
                try:
                    health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
                    self.seconds.append(time.perf_counter() - started)
                except grpc.RpcError as error:
                    self.failures[error.code().name] += 1  # type: ignore[attr-defined]

    def summary(self) -> dict[str, Any]:
        ms = sorted(s * 1000 for s in self.seconds)
        at = (lambda q: round(ms[min(len(ms) - 1, int(q * len(ms)))], 2)) if ms else (lambda q: None)
        return {
            "probes": len(ms) + sum(self.failures.values()),
            "failures": dict(self.failures),
            "p50_ms": at(0.5),
            "p99_ms": at(0.99),
            "max_ms": round(ms[-1], 2) if ms else None,
            "mean_ms": round(statistics.fmean(ms), 2) if ms else None,
        }


async def routes(http: str, count: int, statuses: Counter[str]) -> None:
    """`count` requests cycling every method over unknown and known paths (no body)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=32)) as session:

        async def one(index: int) -> None:
            method, path = METHODS[index % len(METHODS)], PATHS[index // len(METHODS) % len(PATHS)]
            try:
                async with session.request(method, f"http://{http}{path}", data=b"") as answer:
                    await answer.read()
                    statuses[str(answer.status)] += 1
            except aiohttp.ClientError as error:
                statuses[type(error).__name__] += 1

        await asyncio.gather(*(one(i) for i in range(count)))


async def nested(http: str, count: int, statuses: Counter[str]) -> None:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=8)) as session:

        async def one(index: int) -> None:
            route = "/v1/completions" if index % 2 else "/v1/chat/completions"
            try:
                async with session.post(
                    f"http://{http}{route}", data=NESTED, headers={"Content-Type": "application/json"}
                ) as answer:
                    await answer.read()
                    statuses[str(answer.status)] += 1
            except aiohttp.ClientError as error:
                statuses[type(error).__name__] += 1

        await asyncio.gather(*(one(i) for i in range(count)))


async def slowloris(address: str, data: bytes, count: int, hold_s: float) -> dict[str, int]:
    """`count` connections sending `data` a byte a second for `hold_s`: how many the server closed."""
    host, port = address.rsplit(":", 1)
    ended: Counter[str] = Counter()

    async def one() -> None:
        try:
            reader, writer = await asyncio.open_connection(host, int(port))
        except OSError:
            ended["refused"] += 1
            return
        deadline = time.monotonic() + hold_s
        try:
            for byte in data:
                writer.write(bytes([byte]))
                await writer.drain()
                try:
                    if await asyncio.wait_for(reader.read(65536), 1.0) == b"":
                        ended["closed_by_server"] += 1
                        return
                except TimeoutError:
                    pass
                if time.monotonic() > deadline:
                    ended["held_to_the_end"] += 1
                    return
        except OSError:
            ended["closed_by_server"] += 1
        finally:
            writer.close()

    await asyncio.gather(*(one() for _ in range(count)))
    return dict(ended)


async def schemas(address: str, count: int) -> dict[str, int]:
    text = json.dumps(hostile_schema())
    request = pb.GenerateRequest(
        prompt=pb.Prompt(text="Answer in JSON:"),
        constraint=pb.Constraint(json_schema=text),
        stopping=pb.StoppingOptions(max_new_tokens=64),
    )
    codes: Counter[str] = Counter()
    async with grpc.aio.insecure_channel(address) as channel:
        ladder = ladder_pb2_grpc.LadderStub(channel)

        async def one() -> None:
            try:
                await ladder.Generate(request, timeout=2.0)
                codes["OK"] += 1
            except grpc.aio.AioRpcError as error:
                codes[error.code().name] += 1

        await asyncio.gather(*(one() for _ in range(count)))
    return dict(codes)


def scrape(metrics: str) -> dict[str, float]:
    if not metrics:
        return {}
    text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10).read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(METRICS)
    }


def answers(grpc_address: str, http: str) -> dict[str, Any]:
    """Whether the server answers now: gRPC health, a Generate, HTTP /health."""
    found: dict[str, Any] = {}
    with grpc.insecure_channel(grpc_address) as channel:
        try:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=2)
            found["grpc_health"] = True
            hello = pb.GenerateRequest(
                prompt=pb.Prompt(text="Hello"), stopping=pb.StoppingOptions(max_new_tokens=4)
            )
            reply = ladder_pb2_grpc.LadderStub(channel).Generate(hello, timeout=30)
            found["generate_tokens"] = len(reply.token_ids)
        except grpc.RpcError as error:
            found["grpc_error"] = error.code().name  # type: ignore[attr-defined]
    try:
        found["http_health"] = urllib.request.urlopen(f"http://{http}/health", timeout=5).status
    except OSError as error:
        found["http_health"] = repr(error)
    return found


async def attack(args: argparse.Namespace) -> dict[str, Any]:
    http_statuses: Counter[str] = Counter()
    nested_statuses: Counter[str] = Counter()
    half = args.slowloris // 2
    started = time.perf_counter()
    results = await asyncio.gather(
        routes(args.http, args.requests, http_statuses),
        nested(args.http, args.nested, nested_statuses),
        slowloris(args.grpc, H2_PREFACE * 8, half, args.hold_s),
        slowloris(args.http, SLOW_HEADERS, args.slowloris - half, args.hold_s),
        schemas(args.grpc, args.schemas),
    )
    return {
        "seconds": round(time.perf_counter() - started, 1),
        "http_unknown_and_methods": dict(http_statuses),
        "http_nested_json": dict(nested_statuses),
        "slowloris_grpc": results[2],
        "slowloris_http": results[3],
        "hostile_schema_generate": results[4],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grpc", default="127.0.0.1:50051")
    parser.add_argument("--http", default="127.0.0.1:8000")
    parser.add_argument("--metrics", default="127.0.0.1:9464", help="host:port of /metrics ('' = none)")
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--nested", type=int, default=100)
    parser.add_argument("--slowloris", type=int, default=2_000)
    parser.add_argument("--schemas", type=int, default=20)
    parser.add_argument("--hold-s", type=float, default=30.0, help="how long a slowloris connection trickles")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this client holds thousands of sockets
    before = scrape(args.metrics)
    probe = Probe(args.grpc)
    probe.start()
    summary = asyncio.run(attack(args))
    probe.stop.set()
    probe.join()
    summary.update(
        health=probe.summary(),
        after=answers(args.grpc, args.http),
        metrics_before=before,
        metrics_after=scrape(args.metrics),
    )
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
