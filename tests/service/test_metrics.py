"""Prometheus metrics: TTFT, inter-token latency, tokens, padded rows, variants, queue depth."""

from __future__ import annotations

import urllib.request
from pathlib import Path

from prometheus_client import generate_latest

from proto.ladder.v1 import ladder_pb2 as pb
from tests.service.conftest import RunningServer, greedy_request, prompt_ids, server_config


def sample(text: str, name: str) -> float:
    line = next(ln for ln in text.splitlines() if ln.startswith(name + " ") or ln.startswith(name + "{"))
    return float(line.rsplit(" ", 1)[1])


def test_a_generate_call_shows_up_in_every_metric(model_dir: Path) -> None:
    running = RunningServer(server_config(model_dir))
    try:
        reply = running.stub.Generate(greedy_request(prompt_ids(100, seed=40), 8))
        running.stub.GetEngineStats(pb.GetEngineStatsRequest())
        text = generate_latest(running.server.metrics.registry).decode()
    finally:
        running.close()
    assert sample(text, "ladder_time_to_first_token_seconds_count") == 1
    assert sample(text, "ladder_inter_token_seconds_count") == 7
    assert sample(text, "ladder_generated_tokens_total") == 8
    assert sample(text, "ladder_prompt_tokens_total") == 100
    assert sample(text, "ladder_prefill_padded_rows_total") == reply.prefill.padded_rows
    assert sample(text, 'ladder_variants{counter="entries"}') >= 1
    assert sample(text, 'ladder_memory_bytes{part="weights"}') > 0
    assert sample(text, 'ladder_memory_bytes{part="kv"}') > 0
    assert sample(text, "ladder_queue_depth") == 0
    assert 'ladder_calls_total{code="OK",method="Generate"} 1.0' in text


def test_the_metrics_endpoint_serves_over_http(model_dir: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    running = RunningServer(server_config(model_dir))
    http = running.server.metrics.serve_http(port)
    try:
        running.stub.Generate(greedy_request([5, 6, 7], 2))
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "ladder_generated_tokens_total 2.0" in body
    finally:
        http.shutdown()
        running.close()
