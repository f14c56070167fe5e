"""Prometheus metrics of one server, in a registry of its own (tests run several servers).

TTFT and inter-token latency, queue depth, prompt and generated tokens, prefill
forwards with real and padded rows, decode forwards and the rows they
batched, requests waiting for a slot, the variant cache and sessions, and calls
by method and status. Served on config.metrics_port by prometheus-client.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram("ladder_time_to_first_token_seconds", "Request arrival to first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.inter_token = Histogram("ladder_inter_token_seconds", "Gap between consecutive tokens",
                                     buckets=_LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("ladder_queue_depth", "Requests the engine worker holds", registry=r)
        self.prompt_tokens = Counter("ladder_prompt_tokens", "Prompt tokens prefilled", registry=r)
        self.generated_tokens = Counter("ladder_generated_tokens", "Tokens generated", registry=r)
        self.forwards = Counter("ladder_prefill_forwards", "Prefill forwards", registry=r)
        self.real_rows = Counter("ladder_prefill_real_rows", "Prompt rows run by prefill", registry=r)
        self.padded_rows = Counter("ladder_prefill_padded_rows", "Padding rows the ladder added", registry=r)
        self.calls = Counter("ladder_calls", "Finished calls", ["method", "code"], registry=r)
        self.call_seconds = Histogram("ladder_call_seconds", "Call duration", ["method"],
                                      buckets=_LATENCY_BUCKETS, registry=r)
        self.sessions = Gauge("ladder_sessions_open", "Server-side sessions open", registry=r)
        self.variants = Gauge("ladder_variants", "Variant cache counters", ["counter"], registry=r)
        self.memory = Gauge("ladder_memory_bytes", "What the memory budget adds up", ["part"], registry=r)
        self.waiting = Gauge("ladder_waiting_for_slot", "Requests waiting for a free KV slot", registry=r)
        self.decode_forwards = Gauge("ladder_decode_forwards", "Decode forwards run since start", registry=r)
        self.decode_rows = Gauge("ladder_decode_rows", "Session rows those forwards advanced", registry=r)
        self.prefix = PrefixMetrics(r)

    def watch(self, queue_depth: Callable[[], int], sessions: Callable[[], int],
              waiting: Callable[[], int]) -> None:
        self.queue_depth.set_function(queue_depth)
        self.waiting.set_function(waiting)
        self.sessions.set_function(sessions)

    def call_done(self, method: str, code: grpc.StatusCode, seconds: float) -> None:
        self.calls.labels(method, code.name).inc()
        self.call_seconds.labels(method).observe(seconds)

    def prefill(self, forwards: int, real_rows: int, padded_rows: int) -> None:
        self.forwards.inc(forwards)
        self.real_rows.inc(real_rows)
        self.padded_rows.inc(padded_rows)
        self.prompt_tokens.inc(real_rows)

    def engine_stats(self, stats: Any) -> None:
        variants, memory = stats.variants, stats.memory
        self.variants.labels("entries").set(len(variants.entries))
        for name in ("capacity", "hits", "misses", "prepared", "evictions", "refusals", "nbytes"):
            self.variants.labels(name).set(getattr(variants, name))
        for part in ("weights", "kv", "variants", "total", "budget"):
            self.memory.labels(part).set(getattr(memory, part))
        self.decode_forwards.set(stats.decode.steps)
        self.decode_rows.set(stats.decode.rows)
        self.prefix.update(stats.prefix)

    def serve_http(self, port: int) -> Any:
        """Start the /metrics endpoint; returns the HTTP server (None when port is 0)."""
        if not port:
            return None
        server, _thread = start_http_server(port, registry=self.registry)
        return server


# -- prefix reuse -------------------------------------------------------------------------------
class PrefixMetrics:
    """Prefix reuse (EngineStats.prefix): hits, tokens saved, forks, and the held prefixes' bytes."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.counters = Gauge("ladder_prefix", "Prefix reuse counters since start (lookups, hits, "
                              "tokens_saved, forks, evictions)", ["counter"], registry=registry)
        self.slots_held = Gauge("ladder_prefix_slots_held", "Free KV slots keeping a prefix",
                                registry=registry)
        self.bytes_held = Gauge("ladder_prefix_bytes_held", "KV bytes of the prefixes held in free slots",
                                registry=registry)

    def update(self, prefix: Any) -> None:
        for name in ("lookups", "hits", "tokens_saved", "forks", "evictions"):
            self.counters.labels(name).set(getattr(prefix, name))
        self.slots_held.set(prefix.rows_held)
        self.bytes_held.set(prefix.bytes_held)
