"""Prometheus metrics of one server, in a registry of its own (tests run several servers).

Named and typed by Prometheus conventions (base units, `_total` counters,
`_seconds` histograms) and covering what TGI and vLLM export: calls by method
and status code (cancelled and deadline-exceeded included), time to first
token by method, inter-token latency, queue, prefill and decode time per
request, prefill forward and decode step time, prompt and generated length
histograms, finish reasons, running and waiting requests, KV slot usage, the
variant cache, memory, a model info metric, and the process's own metrics.
docs/observability.md lists them all. Served on config.metrics_port by
prometheus-client.

What is observed where:
- per request (service/front/progress.py, on the event loop): TTFT, inter-token,
  queue/prefill/decode time, lengths, finish reasons, token counters;
- per forward (the scheduler, on the worker thread): prefill forward and decode
  step time;
- gauges read when scraped (set_function): queue, running, waiting, sessions,
  KV usage;
- engine counters (variant cache, decode forwards, memory) mirrored from the
  latest engine stats, which the server refreshes every few seconds and on
  every GetEngineStats; they are exported as the counters they are.

With `--frontends N` the calls are served by frontend processes, each with its own Metrics: the
server's registry adds theirs to its own when scraped (service/merged_metrics.py).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

import grpc
from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    Counter,
    Gauge,
    Histogram,
    Info,
    make_wsgi_app,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.planner.drafts import MAX_K
from service.merged_metrics import MergedRegistry
from service.sockets import listening_socket

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
# Decode continues a prompt: no first token. The HTTP API's methods are its routes.
TTFT_METHODS = ("Generate", "GenerateStream", "Prefill", "/v1/completions", "/v1/chat/completions")


class _EngineCollector(Collector):
    """The engine's own counters and gauges, from the latest stats snapshot (none before the first)."""

    def __init__(self) -> None:
        self.stats: Any = None

    def collect(self) -> Iterator[Metric]:
        stats = self.stats
        if stats is None:
            return
        v, d = stats.variants, stats.decode
        for name, value, text in (
            ("hits", v.hits, "Forwards that found their shape prepared in the variant cache"),
            ("misses", v.misses, "Forwards whose shape the variant cache did not hold"),
            ("prepared", v.prepared, "Variants prepared (CUDA: graphs captured)"),
            ("evictions", v.evictions, "Variants evicted to make room"),
            ("refusals", v.refusals, "Shapes the variant cache refused to hold"),
        ):
            yield CounterMetricFamily(f"ladder_variant_cache_{name}", text, value=value)
        yield GaugeMetricFamily("ladder_variant_cache_entries", "Variants held", value=len(v.entries))
        yield GaugeMetricFamily(
            "ladder_variant_cache_capacity", "Variants the cache may hold", value=v.capacity
        )
        yield GaugeMetricFamily("ladder_variant_cache_bytes", "Bytes the held variants own", value=v.nbytes)
        yield CounterMetricFamily(
            "ladder_eager_forwards", "Forwards run without a cached variant", value=stats.eager_forwards
        )
        yield CounterMetricFamily("ladder_decode_forwards", "Decode forwards run", value=d.steps)
        yield CounterMetricFamily(
            "ladder_decode_rows", "Session rows the decode forwards advanced", value=d.rows
        )
        for name, value, text in (
            ("verify_forwards", d.verify_forwards, "Forwards that verified a drafted row (--speculate)"),
            ("drafted_tokens", d.drafted, "Drafted tokens the verification forwards checked"),
            ("accepted_tokens", d.accepted, "Drafted tokens the verification forwards kept"),
        ):
            yield CounterMetricFamily(f"ladder_speculation_{name}", text, value=value)
        accepted = HistogramMetricFamily(
            "ladder_speculation_accepted",
            "Drafted tokens each verification forward kept",
            buckets=_accepted_buckets(d.accepted_per_forward),
            sum_value=d.accepted,
        )
        yield accepted
        memory = GaugeMetricFamily(
            "ladder_memory_bytes", "What the memory budget adds up (budget 0 = none)", labels=["part"]
        )
        for part in ("weights", "kv", "variants", "total", "budget"):
            memory.add_metric([part], getattr(stats.memory, part))
        yield memory
        yield GaugeMetricFamily(
            "ladder_kv_slots", "KV slots (sessions the pool holds at once)", value=stats.slots_allocated
        )


def _accepted_buckets(use: tuple[tuple[int, int], ...]) -> list[tuple[str, float]]:
    """Cumulative buckets 0..MAX_K of (drafted tokens kept, forwards), and +Inf."""
    counts = dict(use)
    buckets, total = [], 0
    for kept in range(MAX_K + 1):
        total += counts.get(kept, 0)
        buckets.append((str(kept), float(total)))
    buckets.append(("+Inf", float(sum(counts.values()))))
    return buckets


class MethodMetrics:
    """The per-request series of one method: `series.ttft` is `metrics.ttft.labels(method)`, looked up
    on first use and kept (a labels() lookup costs a lock and a dict; only series used are exported)."""

    def __init__(self, metrics: Metrics, method: str) -> None:
        self._metrics = metrics
        self._method = method

    def __getattr__(self, name: str) -> Any:
        child = getattr(self._metrics, name).labels(self._method)
        setattr(self, name, child)
        return child


class Metrics:
    def __init__(self) -> None:
        self.registry = MergedRegistry()
        r = self.registry
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            r.register(collector)  # process_* (CPU, RSS, open fds), python_info, python_gc_*
        self.model = Info("ladder_model", "The model served and how", registry=r)
        # Calls: every Ladder call ends in exactly one of these, whatever its code.
        # protocol: grpc, or http (the OpenAI-compatible API: methods named by their routes, codes gRPC's).
        self.calls = Counter(
            "ladder_calls",
            "Finished calls by protocol, method and status code",
            ["protocol", "method", "code"],
            registry=r,
        )
        self.call_seconds = Histogram(
            "ladder_call_seconds",
            "Call duration, arrival to its status",
            ["protocol", "method"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        # Per request.
        self.ttft = Histogram(
            "ladder_time_to_first_token_seconds",
            "Arrival to the prompt's first token (Prefill: to PrefillDone.next_token)",
            ["method"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.inter_token = Histogram(
            "ladder_inter_token_latency_seconds",
            "Gap between consecutive tokens",
            ["method"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            "ladder_request_queue_seconds",
            "Arrival to the start of the request's work on the engine worker "
            "(waiting for a KV slot included)",
            ["method"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.prefill_time = Histogram(
            "ladder_request_prefill_seconds",
            "Start of work to the first token: the prompt's prefill",
            ["method"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.decode_time = Histogram(
            "ladder_request_decode_seconds",
            "First token to the last token",
            ["method"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.prompt_length = Histogram(
            "ladder_request_prompt_tokens",
            "Prompt tokens per request",
            ["method"],
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.output_length = Histogram(
            "ladder_request_generated_tokens",
            "Tokens generated per request",
            ["method"],
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.finished = Counter(
            "ladder_finished", "Generations by how they finished", ["method", "reason"], registry=r
        )
        self.prompt_tokens = Counter("ladder_prompt_tokens", "Prompt tokens prefilled", registry=r)
        self.generated_tokens = Counter("ladder_generated_tokens", "Tokens generated", registry=r)
        # Connections (and calls) a listener refused before any request: by listener and why.
        self.connections_refused = Counter(
            "ladder_connections_refused",
            "Connections or calls a listener refused for a connection limit",
            ["listener", "reason"],
            registry=r,
        )
        self.forwards = Counter("ladder_prefill_forwards", "Prefill forwards", registry=r)
        self.padded_rows = Counter("ladder_prefill_padded_rows", "Padding rows the ladder added", registry=r)
        # Per forward (observed on the worker thread).
        self.prefill_forward = Histogram(
            "ladder_prefill_forward_seconds", "One prefill forward", buckets=_STEP_BUCKETS, registry=r
        )
        self.decode_step = Histogram(
            "ladder_decode_step_seconds",
            "One decode forward (every session decoding at that moment)",
            buckets=_STEP_BUCKETS,
            registry=r,
        )
        # Structured output (service/core/constraints.py).
        self.constrained_requests = Counter(
            "ladder_constrained_requests", "Requests with a constraint, by kind", ["kind"], registry=r
        )
        self.constraint_compile = Histogram(
            "ladder_constraint_compile_seconds",
            "Getting a constraint ready: compiled (or found in the cache) and its first mask",
            ["cache"],
            buckets=_STEP_BUCKETS,
            registry=r,
        )
        # Connections the HTTP listener closed for sending a request's headers too slowly.
        self.connections_timed_out = Counter(
            "ladder_connections_timed_out",
            "Connections closed for sending a request's headers too slowly",
            ["listener"],
            registry=r,
        )
        self.constraint_mask = Histogram(
            "ladder_constraint_mask_seconds_per_token",
            "Time finding the allowed tokens, per constrained token of a request",
            buckets=_STEP_BUCKETS,
            registry=r,
        )
        # Read when scraped.
        self.queue_depth = Gauge(
            "ladder_queue_depth", "Requests the engine worker holds: running + waiting", registry=r
        )
        self.running = Gauge("ladder_requests_running", "Requests the engine worker is running", registry=r)
        self.waiting = Gauge("ladder_requests_waiting", "Requests waiting for a free KV slot", registry=r)
        self.sessions = Gauge(
            "ladder_sessions_open", "Server-side sessions open (Prefill/Decode)", registry=r
        )
        self.kv_usage = Gauge(
            "ladder_kv_cache_usage_ratio",
            "Fraction of the KV slots in use (sessions and running generations)",
            registry=r,
        )
        self.engine = _EngineCollector()
        r.register(self.engine)
        r.register(PrefixCollector(self.engine))
        r.register(ParkingCollector(self.engine))
        r.register(PromptBatchCollector(self.engine))
        self._methods: dict[str, MethodMetrics] = {}

    def for_method(self, method: str) -> MethodMetrics:
        """The per-request series labelled with `method` (cached)."""
        found = self._methods.get(method)
        if found is None:
            found = self._methods[method] = MethodMetrics(self, method)
        return found

    def describe_model(self, labels: dict[str, str]) -> None:
        self.model.info(labels)

    def watch(
        self,
        queue_depth: Callable[[], int],
        sessions: Callable[[], int],
        waiting: Callable[[], int],
        kv_usage: Callable[[], float],
    ) -> None:
        self.queue_depth.set_function(queue_depth)
        self.waiting.set_function(waiting)
        self.running.set_function(lambda: max(0, queue_depth() - waiting()))
        self.sessions.set_function(sessions)
        self.kv_usage.set_function(kv_usage)

    def call_done(self, method: str, code: grpc.StatusCode, seconds: float, protocol: str = "grpc") -> None:
        self.calls.labels(protocol, method, code.name).inc()
        self.call_seconds.labels(protocol, method).observe(seconds)

    def connection_refused(self, listener: str, reason: str) -> None:
        self.connections_refused.labels(listener, reason).inc()

    def forward_done(self, kind: str, seconds: float) -> None:
        """One engine forward ("prefill" or "decode") took `seconds` (called on the worker thread)."""
        (self.prefill_forward if kind == "prefill" else self.decode_step).observe(seconds)

    def prefill(self, forwards: int, real_rows: int, padded_rows: int) -> None:
        self.forwards.inc(forwards)
        self.padded_rows.inc(padded_rows)
        self.prompt_tokens.inc(real_rows)

    def constraint_compiled(self, kind: str, seconds: float, hit: bool) -> None:
        self.constraint_compile.labels("hit" if hit else "miss").observe(seconds)

    def engine_stats(self, stats: Any) -> None:
        """Mirror the engine's counters from this snapshot."""
        self.engine.stats = stats

    def serve_http(self, port: int, host: str = "[::]") -> Any:
        """Start the /metrics endpoint on host:port (the any-address: IPv4 and IPv6, service/sockets.py;
        a thread per request, as prometheus_client's start_http_server); returns the HTTP server (None
        when port is 0). Its loop looks for a shutdown every 50 ms, not every 0.5 s: a drain ends that
        much sooner."""
        if not port:
            return None
        server = _MetricsHttpServer(listening_socket(host, port))
        server.set_app(make_wsgi_app(self.registry))
        threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            daemon=True,
            name="ladder-metrics-http",
        ).start()
        return server


class _MetricsHttpServer(ThreadingMixIn, WSGIServer):
    """The stdlib's WSGI server on a socket bound and listening already (of either family)."""

    daemon_threads = True

    def __init__(self, sock: socket.socket) -> None:
        self.address_family = sock.family
        super().__init__(sock.getsockname()[:2], _QuietHandler, bind_and_activate=False)
        self.socket.close()
        self.socket = sock
        self.server_bind()

    def server_bind(self) -> None:  # bound already: only what HTTPServer.server_bind records
        self.server_address = self.socket.getsockname()
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])
        self.setup_environ()


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        """Scrapes are not logged (the access log is for gRPC calls)."""


# -- views of the engine collector's snapshot ---------------------------------------------------
class _SnapshotView(Collector):
    """Families read from the engine collector's latest stats snapshot (none before the first)."""

    def __init__(self, engine: _EngineCollector) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        stats = self.engine.stats
        if stats is not None:
            yield from self.families(stats)

    def families(self, stats: Any) -> Iterator[Metric]:
        raise NotImplementedError


# -- prefix reuse -------------------------------------------------------------------------------
class PrefixCollector(_SnapshotView):
    """Prefix reuse (EngineStats.prefix) from the engine collector's latest snapshot: hits, tokens saved,
    forks, evictions, and the prefixes free KV slots hold."""

    def families(self, stats: Any) -> Iterator[Metric]:
        p = stats.prefix
        for name, value, text in (
            ("lookups", p.lookups, "Prompts appended to an empty session, looked up among held prefixes"),
            ("hits", p.hits, "Prompts that started from a held prefix"),
            ("tokens_saved", p.tokens_saved, "Prompt tokens copied from a held prefix, not prefilled"),
            ("forks", p.forks, "Sessions forked (ForkSession)"),
            ("evictions", p.evictions, "Held prefixes dropped because a session needed their KV slot"),
        ):
            yield CounterMetricFamily(f"ladder_prefix_{name}", text, value=value)
        yield GaugeMetricFamily(
            "ladder_prefix_slots_held", "Free KV slots keeping a prefix", value=p.rows_held
        )
        yield GaugeMetricFamily(
            "ladder_prefix_bytes_held", "KV bytes of the prefixes free slots hold", value=p.bytes_held
        )


# -- prompts sharing a prefill forward ----------------------------------------------------------
class PromptBatchCollector(_SnapshotView):
    """New prompts sharing a prefill forward (EngineStats.prompt_batches) from the engine
    collector's latest snapshot."""

    def families(self, stats: Any) -> Iterator[Metric]:
        for name, value, text in (
            ("forwards", stats.prompt_forwards, "Prefill forwards that ran several new prompts at once"),
            ("prompts", stats.prompts_batched, "New prompts those forwards ran"),
        ):
            yield CounterMetricFamily(f"ladder_prompt_batch_{name}", text, value=value)


# -- sessions beyond slots ----------------------------------------------------------------------
class ParkingCollector(_SnapshotView):
    """Sessions parked off their KV slots (EngineStats.parking) from the engine collector's latest
    snapshot: how many and their bytes now, parks and unparks and the seconds they took."""

    def families(self, stats: Any) -> Iterator[Metric]:
        p = stats.parking
        yield GaugeMetricFamily(
            "ladder_sessions_parked", "Open sessions parked off their KV slot", value=p.sessions_parked
        )
        yield GaugeMetricFamily(
            "ladder_parked_bytes", "KV and logits bytes parked sessions hold", value=p.parked_bytes
        )
        yield GaugeMetricFamily(
            "ladder_parked_device_bytes",
            "Of those, the bytes in device memory (CUDA; the rest is host memory)",
            value=p.device_bytes,
        )
        for name, value, text in (
            ("parks", p.parks, "Sessions moved off their KV slot"),
            ("unparks", p.unparks, "Parked sessions brought back into a KV slot"),
            ("parked_spills", p.spills, "Parked sessions moved from device to host memory"),
            ("park_seconds", p.park_seconds, "Seconds spent parking sessions"),
            ("unpark_seconds", p.unpark_seconds, "Seconds spent bringing parked sessions back"),
        ):
            yield CounterMetricFamily(f"ladder_{name}", text, value=value)
