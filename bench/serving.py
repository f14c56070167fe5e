"""Serving under load: open-loop arrivals against a real server, over gRPC or the OpenAI HTTP API.

Starts `python -m service` (model resolved by bench/served.py) or drives --target/--http-target.
Per rate: request and output-token throughput, TTFT p50/p90/p99, inter-token p50/p99, end-to-end
p50/p99, goodput under an SLO and errors. `--concurrency N` keeps N streams in flight instead and
runs gRPC and HTTP side by side on one server, interleaved, for the HTTP/gRPC tok/s ratio.

Lengths are lognormal. The means are ShareGPT's as the vLLM paper reports them (Kwon et al., SOSP
2023, Fig. 11: 161 prompt and 338 output tokens; vLLM's benchmark_serving samples the same data);
sigma 1.0 is ours, not fitted (a long tail like the paper's histograms). `--scale` multiplies both
means (a small model, a slow machine); `--prompt-len`/`--output-len` fix them instead. Every request
is greedy with ignore_eos, so its output has the asked length. Arrivals are Poisson at each rate
(`--burst N`: N at once); everything random comes from `--seed`.

    python -m bench.serving --protocol grpc --rates 0.5,1,2 --scale 0.25 --out $OUT
    python -m bench.serving --concurrency 16 --repeats 3 --prompt-len 128 --output-len 128 --out $OUT
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import numpy as np

from bench import served
from bench.served import free_port, machine, prompt, resolve_model, server_arguments, vocab_of, wait_serving

SHAREGPT_MEAN_PROMPT, SHAREGPT_MEAN_OUTPUT, SIGMA = 161, 338, 1.0
MIN_LENGTH = 4


@dataclass
class Record:
    """One request as the client saw it: when it was sent, when each output token arrived."""

    start: float
    times: list[float] = field(default_factory=list)
    error: str = ""
    detail: str = ""  # what the failure said, when, and after how many tokens


@dataclass(frozen=True)
class Slo:
    ttft_ms: float
    itl_ms: float  # a request's mean inter-token gap (vLLM's TPOT)


Request = tuple[list[int], int]  # prompt token ids, output tokens
Call = Callable[[list[int], int], Awaitable[Record]]


# -- the workload ---------------------------------------------------------------------------------
def lognormal(rng: np.random.Generator, mean: float, n: int, cap: int) -> list[int]:
    """n lengths with the given mean (mu = ln(mean) - sigma^2 / 2), clipped to [MIN_LENGTH, cap]."""
    values = rng.lognormal(np.log(mean) - SIGMA**2 / 2, SIGMA, n)
    return [int(v) for v in np.clip(np.rint(values), MIN_LENGTH, cap)]


def workload(args: argparse.Namespace, n: int, seed: int, vocab: int) -> list[Request]:
    rng = np.random.default_rng(seed)
    half = args.capacity // 2
    prompts = (
        [args.prompt_len] * n
        if args.prompt_len
        else lognormal(rng, SHAREGPT_MEAN_PROMPT * args.scale, n, half)
    )
    outputs = (
        [args.output_len] * n
        if args.output_len
        else lognormal(rng, SHAREGPT_MEAN_OUTPUT * args.scale, n, half)
    )
    return [
        (prompt(p, seed * 100_000 + i, vocab), o)
        for i, (p, o) in enumerate(zip(prompts, outputs, strict=True))
    ]


def arrivals(n: int, rate: float, rng: np.random.Generator) -> list[float]:
    """Seconds after the start at which each request is sent: a Poisson process (rate inf: all at 0)."""
    if rate == float("inf"):
        return [0.0] * n
    gaps = rng.exponential(1 / rate, n)
    return [float(t) for t in np.cumsum(gaps) - gaps[0]]  # the first request goes at once


# -- the clients: each returns a Record, never raises for a failed call ------------------------------
def grpc_caller(address: str, coalesce: bool = False, temperature: float = 0.0, top_p: float = 1.0) -> Call:
    """GenerateStream; with `coalesce` the tokens that are ready together come in one message, and
    each of them is timed at that message's arrival. A `temperature` above 0 samples (with `top_p`),
    each call with a seed of its own."""
    from clients.python.async_client import AsyncLadderClient
    from clients.python.channel import Connection
    from clients.python.messages import Sampling, Stopping, tokens_of

    client = AsyncLadderClient(Connection(address, timeout_s=600))
    seeds = itertools.count(int(time.time_ns() % 2**32))

    async def call(tokens: list[int], new: int) -> Record:
        record = Record(time.perf_counter())
        try:
            sampling = Sampling(temperature, top_p=top_p, seed=next(seeds)) if temperature else None
            stopping = Stopping(new, ignore_eos=True)
            async for event in client.generate_stream(
                tokens, sampling=sampling, stopping=stopping, coalesce=coalesce
            ):
                now = time.perf_counter()
                record.times.extend(now for _ in tokens_of(event))
        except grpc.aio.AioRpcError as exc:
            record.error = exc.code().name
            elapsed = 1e3 * (time.perf_counter() - record.start)
            record.detail = (
                f"{exc.details()!r} after {elapsed:.1f} ms and {len(record.times)} tokens"
                f" ({exc.debug_error_string()})"
            )
        return record

    return call


def http_caller(session: aiohttp.ClientSession, address: str, model: str) -> Call:
    """Streamed /v1/completions; each SSE chunk is parsed as an OpenAI client would."""
    url = f"http://{address}/v1/completions"

    async def call(tokens: list[int], new: int) -> Record:
        body = {
            "model": model,
            "prompt": tokens,
            "max_tokens": new,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
        }
        record = Record(time.perf_counter())
        try:
            async with session.post(url, json=body) as response:
                if response.status != 200:
                    record.error = f"HTTP {response.status}"
                    return record
                async for line in response.content:
                    _read_event(line, record)
        except aiohttp.ClientError as exc:
            record.error = type(exc).__name__
        return record

    return call


def _read_event(line: bytes, record: Record) -> None:
    """A token's chunk has finish_reason null; the finish chunk carries no new token."""
    if not line.startswith(b"data: {"):
        return
    chunk = json.loads(line[6:])
    if "error" in chunk:
        record.error = chunk["error"].get("code") or "stream error"
    elif chunk["choices"] and chunk["choices"][0]["finish_reason"] is None:
        record.times.append(time.perf_counter())


async def served_model(session: aiohttp.ClientSession, address: str) -> str:
    async with session.get(f"http://{address}/v1/models") as response:
        return str((await response.json())["data"][0]["id"])


# -- the loads ----------------------------------------------------------------------------------------
async def open_loop(
    call: Call, work: Sequence[Request], offsets: Sequence[float], began: float | None = None
) -> tuple[list[Record], float]:
    """Send each request at its offset (after `began` on perf_counter's clock, default now) whatever
    is still running; the records and the wall time."""
    began = time.perf_counter() if began is None else began

    async def one(request: Request, at: float) -> Record:
        await asyncio.sleep(max(0.0, began + at - time.perf_counter()))
        return await call(*request)

    records = await asyncio.gather(*(one(r, at) for r, at in zip(work, offsets, strict=True)))
    return list(records), time.perf_counter() - began


async def closed_loop(call: Call, work: Sequence[Request], concurrency: int) -> tuple[list[Record], float]:
    """`concurrency` streams always in flight: each takes the next request as its last one ends."""
    queue, records = iter(work), []
    began = time.perf_counter()

    async def stream() -> None:
        for request in queue:  # one iterator shared by every stream
            records.append(await call(*request))

    await asyncio.gather(*(stream() for _ in range(concurrency)))
    return records, time.perf_counter() - began


# -- the summary (pure) ---------------------------------------------------------------------------------
def percentiles(values: Sequence[float], qs: Sequence[int]) -> dict[str, float | None]:
    """p<q> of the values in ms (values in seconds); None for every q when there are none."""
    return {f"p{q}": (1e3 * float(np.percentile(values, q)) if len(values) else None) for q in qs}


def mean_gap(record: Record) -> float | None:
    """A request's mean inter-token gap in seconds (None under two tokens)."""
    if len(record.times) < 2:
        return None
    return (record.times[-1] - record.times[0]) / (len(record.times) - 1)


def message_gaps(records: Sequence[Record]) -> list[float]:
    """The inter-token gaps a reader waits through: between one message and the next. Tokens that
    came in one message (a coalesced stream) share its arrival time; the zero gaps between them are
    not waits, so they are left out (one token per message: every gap between tokens)."""
    return [b - a for r in records for a, b in zip(r.times, r.times[1:], strict=False) if b > a]


def meets(record: Record, slo: Slo) -> bool:
    """Served, first token within the TTFT objective, mean gap within the inter-token objective."""
    if record.error or not record.times:
        return False
    gap = mean_gap(record)
    return (record.times[0] - record.start) * 1e3 <= slo.ttft_ms and (gap is None or gap * 1e3 <= slo.itl_ms)


def window_rate(records: Sequence[Record]) -> float | None:
    """Output tokens per second while requests were still arriving (from the first send to the last):
    the server's throughput under the offered load, without the ramp-down after the last arrival
    that `output_tok_s` (over the whole run) includes. None for a burst (one instant)."""
    first, last = min(r.start for r in records), max(r.start for r in records)
    if last <= first:
        return None
    return sum(first <= t <= last for r in records for t in r.times) / (last - first)


def summarize(records: Sequence[Record], duration: float, slo: Slo) -> dict[str, Any]:
    served = [r for r in records if not r.error and r.times]
    gaps = message_gaps(served)
    good = sum(meets(r, slo) for r in records)
    return {
        "requests": len(records),
        "errors": len(records) - len(served),
        # What each unserved request got: a status, or "no tokens" (ended before its first token).
        "error_kinds": dict(Counter(r.error or "no tokens" for r in records if r.error or not r.times)),
        "error_examples": [f"{r.error}: {r.detail}" for r in records if r.error][:3],
        "duration_s": duration,
        "request_s": len(served) / duration,
        "output_tok_s": sum(len(r.times) for r in served) / duration,
        "window_tok_s": window_rate(records),
        "ttft_ms": percentiles([r.times[0] - r.start for r in served], (50, 90, 99)),
        "itl_ms": percentiles(gaps, (50, 99)),
        "e2e_ms": percentiles([r.times[-1] - r.start for r in served], (50, 99)),
        "goodput_request_s": good / duration,
        "good_fraction": good / len(records) if records else None,
        "slo": asdict(slo),
    }


def ratio(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """HTTP over gRPC output tok/s: per interleaved pair, their median, and the medians' ratio; the
    median CPU per token of each side when the rounds measured it."""
    by = {p: [r["output_tok_s"] for r in rounds if r["protocol"] == p] for p in ("grpc", "http")}
    pairs = [h / g for g, h in zip(by["grpc"], by["http"], strict=True)]
    cpu = {
        f"{p}_{k}_median": statistics.median(r[k] for r in rounds if r["protocol"] == p)
        for p in ("grpc", "http")
        for k in ("server_cpu_ms_per_token", "client_cpu_ms_per_token")
        if all(k in r for r in rounds)
    }
    return {
        "pairs": pairs,
        "median_of_pairs": statistics.median(pairs),
        "of_medians": statistics.median(by["http"]) / statistics.median(by["grpc"]),
        "grpc_tok_s": by["grpc"],
        "http_tok_s": by["http"],
        **cpu,
    }


# -- the runs -------------------------------------------------------------------------------------------
@dataclass
class Clients:
    """Both protocols' callers against one server, and the HTTP session to close."""

    calls: dict[str, Call]
    session: aiohttp.ClientSession

    def of(self, protocol: str) -> Call:
        return self.calls[protocol]


async def connect(
    grpc_address: str, http_address: str, coalesce: bool = False, temperature: float = 0.0, top_p: float = 1.0
) -> Clients:
    """gRPC always; HTTP when its address is known (a started server, or --http-target)."""
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=600)
    )
    calls = {"grpc": grpc_caller(grpc_address, coalesce, temperature, top_p)}
    if http_address:
        calls["http"] = http_caller(session, http_address, await served_model(session, http_address))
    return Clients(calls, session)


async def warm_up(clients: Clients, args: argparse.Namespace, vocab: int) -> None:
    """Both protocols' connections and the server's first calls, before anything is timed."""
    work = [(r[0], min(r[1], 8)) for r in workload(args, 2 * args.concurrency_or_16, 7, vocab)]
    for call in clients.calls.values():
        await closed_loop(call, work, args.concurrency_or_16)


async def sweep(
    clients: Clients,
    args: argparse.Namespace,
    vocab: int,
    slo: Slo,
    address: str,
    http_address: str,
    server: int | None,
) -> dict[str, Any]:
    """One open-loop run per rate (and the burst), each with its own requests from the seed; with
    what the server's process and the client's spent of the wall time, and the server's decode steps
    (its mean rows per step and steps per second under that load). `--attach` runs beside the loads."""
    out: dict[str, Any] = {}
    loads = [(str(rate), rate, args.requests) for rate in args.rates]
    if args.burst:
        loads.append((f"burst {args.burst}", float("inf"), args.burst))
    attached = (
        subprocess.Popen(args.attach.replace("{pid}", str(server)), shell=True)  # noqa: S602 — the user's own command
        if args.attach and server
        else None
    )
    for i, (name, rate, n) in enumerate(loads):
        work = workload(args, n, args.seed + i, vocab)
        offsets = arrivals(n, rate, np.random.default_rng(args.seed + i))
        before, helpers = Usage.now(address, server), 0.0
        if args.client_procs > 1:
            records, duration, helpers = split_open_loop(args, address, http_address, work, offsets)
        else:
            records, duration = await open_loop(clients.of(args.protocol), work, offsets)
        asked = sum(new for _, new in work) / (offsets[-1] - offsets[0]) if offsets[-1] > offsets[0] else None
        out[name] = {
            "rate": rate if rate != float("inf") else None,
            "asked_tok_s": asked,
            **summarize(records, duration, slo),
            **Usage.now(address, server).since(before, duration, helpers),
        }
        print(name, json.dumps(out[name]), flush=True)
    if attached:
        attached.wait()
    return out


@dataclass(frozen=True)
class Usage:
    """CPU seconds of this client's process and of the server, and the server's decode counters, at
    one moment."""

    client_cpu: float
    server_cpu: float  # its frontend processes included
    core_cpu: float  # the process that runs the engine alone
    steps: int
    rows: int
    prepared: int  # shape variants prepared so far (one under load is a stall: graph capture)
    threads: dict[int, float]  # CPU seconds of each thread of the core's process, by thread id

    @staticmethod
    def now(address: str, server: int | None) -> Usage:
        stats = served.engine_stats(address)
        return Usage(
            cpu_seconds(None),
            cpu_seconds(server) if server else 0.0,
            cpu_seconds(server, children=False) if server else 0.0,
            stats["decode_steps"],
            stats["decode_rows"],
            stats["prepared"],
            thread_seconds(server) if server else {},
        )

    def since(self, before: Usage, wall: float, helpers: float = 0.0) -> dict[str, Any]:
        """Cores used over `wall` seconds (the client's with its helper processes' `helpers` CPU
        seconds; the server's None when not started here), decode steps per second and mean rows
        per step."""
        steps = self.steps - before.steps
        return {
            "client_cores": (self.client_cpu - before.client_cpu + helpers) / wall,
            "server_cores": (self.server_cpu - before.server_cpu) / wall if self.server_cpu else None,
            "core_cores": (self.core_cpu - before.core_cpu) / wall if self.core_cpu else None,
            "decode_steps_s": steps / wall,
            "rows_per_step": (self.rows - before.rows) / steps if steps else None,
            "variants_prepared": self.prepared - before.prepared,
            "core_threads": busiest_threads(before.threads, self.threads, wall),
        }


def busiest_threads(
    before: dict[int, float], after: dict[int, float], wall: float, shown: int = 4
) -> list[Any]:
    """Where the core's process spends its cores: [thread, cores] for its `shown` busiest threads
    (the main thread, which runs its event loop, named "main"), then ["rest (k threads)", cores]."""
    used = sorted(((after[t] - before.get(t, 0.0), t) for t in after), reverse=True)
    top: list[Any] = [["main" if t == 0 else str(t), round(cpu / wall, 3)] for cpu, t in used[:shown]]
    if used[shown:]:
        rest = sum(cpu for cpu, _ in used[shown:]) / wall
        top.append([f"rest ({len(used) - shown} threads)", round(rest, 3)])
    return top


# -- the open loop split over processes (one asyncio client's CPU must not be what is measured) ------
def split_open_loop(
    args: argparse.Namespace,
    address: str,
    http_address: str,
    work: Sequence[Request],
    offsets: Sequence[float],
) -> tuple[list[Record], float, float]:
    """The same arrivals, request i sent by process i mod N over `args.protocol`, all timed on one
    clock (perf_counter is CLOCK_MONOTONIC, shared by every process on the host): the records back in
    request order, the wall time, and the CPU seconds the processes spent from the start to their
    last request's end."""
    procs = args.client_procs
    start = time.perf_counter() + 3.0  # every helper has its channel up by then
    context = multiprocessing.get_context("spawn")  # grpc's state must not be forked
    with context.Pool(procs) as pool:
        parts = pool.starmap(
            _open_loop_part,
            [
                (
                    address if args.protocol == "grpc" else http_address,
                    args.protocol,
                    list(work[k::procs]),
                    list(offsets[k::procs]),
                    start,
                    args.coalesce,
                    args.temperature,
                    args.top_p,
                )
                for k in range(procs)
            ],
        )
    records = interleave([[Record(**r) for r in part] for part, _ in parts])
    wall = max((max(r.times, default=r.start) for r in records), default=start) - start
    return records, wall, sum(cpu for _, cpu in parts)


def interleave(parts: Sequence[Sequence[Record]]) -> list[Record]:
    """Process k's records (requests k, k + N, k + 2N ... of N processes) back in request order."""
    records: list[Record] = [Record(0.0)] * sum(len(part) for part in parts)
    for k, part in enumerate(parts):
        records[k :: len(parts)] = part
    return records


def _open_loop_part(
    address: str,
    protocol: str,
    work: list[Request],
    offsets: list[float],
    start: float,
    coalesce: bool,
    temperature: float,
    top_p: float,
) -> tuple[list[dict[str, Any]], float]:
    async def run() -> tuple[list[Record], float]:
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=600)
        ) as session:
            call = (
                grpc_caller(address, coalesce, temperature, top_p)
                if protocol == "grpc"
                else http_caller(session, address, await served_model(session, address))
            )
            await call(work[0][0][:4], 1)  # the channel up before the clock starts
            await asyncio.sleep(max(0.0, start - time.perf_counter()))
            cpu = cpu_seconds(None)
            records = (await open_loop(call, work, offsets, start))[0]
            return records, cpu_seconds(None) - cpu

    records, cpu = asyncio.run(run())
    return [asdict(r) for r in records], cpu


def cpu_seconds(pid: int | None, children: bool = True) -> float:
    """User + system CPU of a process (this one when None), its threads included, and (`children`) of
    the live processes it started: a server's gRPC frontends (--frontends) are part of the server."""
    if pid is None:
        times = os.times()
        return times.user + times.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return own + sum(cpu_seconds(child, False) for child in child_pids(pid)) if children else own


def thread_seconds(pid: int) -> dict[int, float]:
    """User + system CPU seconds of each live thread of a process (its own, not its children's); the
    main thread's id is given as 0."""
    found = {}
    for stat in Path(f"/proc/{pid}/task").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        tid = int(stat.parent.name)
        found[0 if tid == pid else tid] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return found


def child_pids(pid: int) -> list[int]:
    """The live processes whose parent is `pid`."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


async def one_round(
    call: Call, work: Sequence[Request], args: argparse.Namespace, slo: Slo, server: int | None
) -> dict[str, Any]:
    """A closed-loop round, with the CPU the server (when started here) and this client spent per token."""
    before = cpu_seconds(None), cpu_seconds(server) if server else 0.0
    records, duration = await closed_loop(call, work, args.concurrency)
    found = summarize(records, duration, slo)
    tokens = found["output_tok_s"] * duration
    found["client_cpu_ms_per_token"] = 1e3 * (cpu_seconds(None) - before[0]) / tokens
    if server:
        found["server_cpu_ms_per_token"] = 1e3 * (cpu_seconds(server) - before[1]) / tokens
    return found


async def side_by_side(
    clients: Clients, args: argparse.Namespace, vocab: int, slo: Slo, server: int | None
) -> dict[str, Any]:
    """gRPC, HTTP, gRPC, HTTP ...: the same requests each round, on the same server."""
    work = workload(args, args.requests, args.seed, vocab)
    rounds = []
    for i in range(args.repeats):
        for protocol in ("grpc", "http"):
            found = await one_round(clients.of(protocol), work, args, slo, server)
            rounds.append({"protocol": protocol, "round": i, **found})
            print(protocol, i, round(found["output_tok_s"], 1), flush=True)
    return {"concurrency": args.concurrency, "rounds": rounds, "http_over_grpc": ratio(rounds)}


async def measure(
    args: argparse.Namespace, grpc_address: str, http_address: str, vocab: int, server: int | None = None
) -> dict[str, Any]:
    slo = Slo(args.slo_ttft_ms, args.slo_itl_ms)
    clients = await connect(grpc_address, http_address, args.coalesce, args.temperature, args.top_p)
    try:
        await warm_up(clients, args, vocab)
        if args.concurrency:
            return {"side_by_side": await side_by_side(clients, args, vocab, slo, server)}
        loads = await sweep(clients, args, vocab, slo, grpc_address, http_address, server)
        return {"protocol": args.protocol, "loads": loads}
    finally:
        await clients.session.close()


def start_server(
    args: argparse.Namespace, model: str, grpc_port: int, http_port: int
) -> subprocess.Popen[bytes]:
    slots = str(args.max_sessions)
    return served.start_server(
        args,
        model,
        grpc_port,
        "--http-port",
        str(http_port),
        "--max-sessions",
        slots,
        "--sessions-per-caller",
        slots,
        "--max-queue",
        "4096",
        "--capacity",
        str(args.capacity),
        *args.server_args.split(),
        log=str(args.server_log),
        python=tuple(args.server_python.split()),
        root=args.server_root,
    )


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    server_arguments(parser, provider="cpu", model="default", precision="int4")
    parser.add_argument("--target", default="", help="a running server's gRPC host:port (none: start one)")
    parser.add_argument("--http-target", default="", help="its HTTP host:port")
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    parser.add_argument("--rates", default="0.5,1,2", help="requests/s, comma-separated")
    parser.add_argument("--burst", type=int, default=0, help="also N requests at once")
    parser.add_argument("--requests", type=int, default=40, help="requests per rate (per round)")
    parser.add_argument("--concurrency", type=int, default=0, help="closed loop, gRPC vs HTTP side by side")
    parser.add_argument(
        "--client-procs",
        type=int,
        default=1,
        help="open loop over gRPC from N processes (client_cores: when one is not enough)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds per protocol")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies ShareGPT's mean lengths")
    parser.add_argument("--prompt-len", type=int, default=0, help="fixed prompt tokens (0: lognormal)")
    parser.add_argument("--output-len", type=int, default=0, help="fixed output tokens (0: lognormal)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=0.0, help="gRPC calls sample above 0 (seeded)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument(
        "--coalesce",
        action="store_true",
        help="gRPC: ask for coalesce_tokens (tokens ready together in one message)",
    )
    parser.add_argument("--slo-ttft-ms", type=float, default=None, help="default 200 on CUDA, 1000 on CPU")
    parser.add_argument("--slo-itl-ms", type=float, default=None, help="default 50 on CUDA, 100 on CPU")
    parser.add_argument("--capacity", type=int, default=2048)
    parser.add_argument("--max-sessions", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=0, help="with --target: the model's vocabulary")
    parser.add_argument("--server-args", default="", help="more flags for the started server")
    parser.add_argument("--server-python", default="", help='e.g. "-m cProfile -o /tmp/server.prof"')
    parser.add_argument(
        "--attach",
        default="",
        help="a shell command started as the timed loads begin, {pid} the server's (a "
        'profiler: "py-spy record --pid {pid} -d 20 -o prof.txt -f raw"); waited for',
    )
    parser.add_argument(
        "--server-root",
        type=Path,
        default=None,
        help="serve from another tree of Ladder (a baseline, side by side)",
    )
    parser.add_argument("--server-log", type=Path, default=Path("/tmp/ladder-bench-serving.log"))
    args = parser.parse_args()
    args.rates = [float(r) for r in args.rates.split(",") if r]
    if args.client_procs > 1 and args.concurrency:
        parser.error("--client-procs splits the open loop only")
    cpu = args.provider == "cpu"  # a 2-core decode step of 16 rows is ~50-80 ms: 200/50 fails every request
    args.slo_ttft_ms = args.slo_ttft_ms or (1000.0 if cpu else 200.0)
    args.slo_itl_ms = args.slo_itl_ms or (100.0 if cpu else 50.0)
    args.concurrency_or_16 = args.concurrency or 16
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.target:
        return asyncio.run(measure(args, args.target, args.http_target, args.vocab or 32000))
    model = resolve_model(args)
    vocab = vocab_of(model)
    grpc_port, http_port = free_port(), free_port()
    server = start_server(args, model, grpc_port, http_port)
    try:
        wait_serving(f"127.0.0.1:{grpc_port}")
        found = asyncio.run(
            measure(args, f"127.0.0.1:{grpc_port}", f"127.0.0.1:{http_port}", vocab, server.pid)
        )
    finally:
        server.terminate()
        server.wait(120)
    return {"model": model, **found}


def main() -> None:
    args = parse()
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "machine": machine(),
        "command": " ".join(["python -m bench.serving", *sys.argv[1:]]),
        "settings": {k: str(v) for k, v in vars(args).items()},
        **run(args),
    }
    name = f"side-by-side-{args.concurrency}" if args.concurrency else f"sweep-{args.protocol}"
    path = args.out / f"{name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    if not args.concurrency and args.rates:  # a burst alone has no curve
        from bench.serving_plot import write

        print(write(path))
    print(path)


if __name__ == "__main__":
    main()
