"""Prometheus metrics, scraped over HTTP from a real server after real calls: values, not just names."""

from __future__ import annotations

import re
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from proto.ladder.v1 import ladder_pb2 as pb
from service.merged_metrics import call_families
from service.metrics import Metrics
from tests.support.prompts import greedy_request, prompt_ids
from tests.support.servers import FRONTENDS, FRONTENDS_IDS, RunningServer, free_port, server_config
from tests.support.waiting import wait_for


class Scraped:
    """One scrape of /metrics: samples by name and labels, and each family's type."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.types: dict[str, str] = {}
        self.samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for family in text_string_to_metric_families(text):
            self.types[family.name] = family.type
            for s in family.samples:
                self.samples[(s.name, frozenset(s.labels.items()))] = s.value

    def get(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))

    def __call__(self, name: str, **labels: str) -> float:
        value = self.get(name, **labels)
        assert value is not None, f"{name}{labels} is not exported"
        return value


class Endpoint:
    def __init__(self, running: RunningServer) -> None:
        self.port = free_port()
        running.server.start_metrics(self.port)
        self.running = running

    def scrape(self) -> Scraped:
        body = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10).read()
        return Scraped(body.decode())


@pytest.fixture(params=FRONTENDS, ids=FRONTENDS_IDS)
def served(served_model: Path, request: pytest.FixtureRequest) -> Iterator[Endpoint]:
    running = RunningServer(server_config(served_model, max_sessions=4, frontends=request.param))
    try:
        yield Endpoint(running)
    finally:
        running.close()


def test_a_generate_call_is_in_every_request_metric_with_its_values(served: Endpoint) -> None:
    stub = served.running.stub
    reply = stub.Generate(greedy_request(prompt_ids(100, seed=40), 8))
    m = served.scrape()
    g = {"method": "Generate"}
    assert m("ladder_calls_total", protocol="grpc", method="Generate", code="OK") == 1
    assert m("ladder_call_seconds_count", protocol="grpc", **g) == 1
    assert m("ladder_time_to_first_token_seconds_count", **g) == 1
    assert m("ladder_inter_token_latency_seconds_count", **g) == 7, "8 tokens have 7 gaps"
    assert m("ladder_request_queue_seconds_count", **g) == 1
    assert m("ladder_request_prefill_seconds_count", **g) == 1
    assert m("ladder_request_decode_seconds_count", **g) == 1
    assert m("ladder_request_prompt_tokens_count", **g) == 1
    assert m("ladder_request_prompt_tokens_sum", **g) == 100
    assert m("ladder_request_generated_tokens_sum", **g) == 8
    assert m("ladder_request_prompt_tokens_bucket", le="64.0", **g) == 0
    assert m("ladder_request_prompt_tokens_bucket", le="128.0", **g) == 1
    assert m("ladder_finished_total", method="Generate", reason="length") == 1
    assert m("ladder_prompt_tokens_total") == 100 and m("ladder_generated_tokens_total") == 8
    assert m("ladder_prefill_forwards_total") == reply.prefill.forwards
    assert m("ladder_prefill_padded_rows_total") == reply.prefill.padded_rows
    assert m("ladder_prefill_forward_seconds_count") == reply.prefill.forwards
    # The first token comes from the prefill's logits; each later one is one decode forward.
    assert m("ladder_decode_step_seconds_count") == 7
    assert m("ladder_queue_depth") == 0 and m("ladder_requests_running") == 0
    assert m("ladder_requests_waiting") == 0


def test_ttft_is_labelled_by_method_and_decode_observes_none(served: Endpoint) -> None:
    stub = served.running.stub
    first = pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=prompt_ids(30, seed=2))))
    done = list(stub.Prefill(iter([first])))[-1].done
    decode = pb.DecodeRequest(
        session_id=done.session_id, stopping=pb.StoppingOptions(max_new_tokens=5, ignore_eos=True)
    )
    list(stub.Decode(decode))
    list(stub.GenerateStream(greedy_request(prompt_ids(10, seed=3), 3)))
    m = served.scrape()
    assert m("ladder_time_to_first_token_seconds_count", method="Prefill") == 1
    assert m("ladder_time_to_first_token_seconds_count", method="GenerateStream") == 1
    assert m.get("ladder_time_to_first_token_seconds_count", method="Decode") is None
    assert m("ladder_inter_token_latency_seconds_count", method="Decode") == 4
    assert m("ladder_request_prompt_tokens_sum", method="Prefill") == 30
    assert m("ladder_request_generated_tokens_sum", method="Decode") == 5
    assert m("ladder_finished_total", method="Decode", reason="length") == 1


def test_sessions_and_kv_usage_follow_open_and_close(served: Endpoint) -> None:
    stub = served.running.stub
    first = pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=[5, 6, 7])))
    session = list(stub.Prefill(iter([first])))[-1].done.session_id
    opened = served.scrape()
    stub.CloseSession(pb.CloseSessionRequest(session_id=session))
    closed = served.scrape()
    assert opened("ladder_sessions_open") == 1 and opened("ladder_kv_cache_usage_ratio") == 0.25
    assert closed("ladder_sessions_open") == 0 and closed("ladder_kv_cache_usage_ratio") == 0


def test_a_request_waiting_for_a_slot_is_waiting_not_running(served_model: Path) -> None:
    running = RunningServer(server_config(served_model, max_sessions=1, session_memory_mb=0))
    endpoint = Endpoint(running)
    try:
        first = pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=[5, 6])))
        held = list(running.stub.Prefill(iter([first])))[-1].done.session_id
        call = running.stub.Generate.future(greedy_request([5, 6], 2))
        wait_for(lambda: endpoint.scrape()("ladder_requests_waiting") == 1)
        m = endpoint.scrape()
        assert (m("ladder_requests_running"), m("ladder_queue_depth")) == (0, 1)
        assert m("ladder_kv_cache_usage_ratio") == 1
        running.stub.CloseSession(pb.CloseSessionRequest(session_id=held))
        assert len(call.result(timeout=30).token_ids) == 2
        m = endpoint.scrape()
        assert (m("ladder_requests_waiting"), m("ladder_requests_running")) == (0, 0)
        assert m("ladder_request_queue_seconds_count", method="Generate") == 1
    finally:
        running.close()


def test_finish_reasons_and_every_status_code_are_counted(served: Endpoint) -> None:
    stub = served.running.stub
    greedy = stub.Generate(greedy_request(prompt_ids(12, seed=5), 4))
    stub.Generate(greedy_request(prompt_ids(12, seed=5), 4, stop_token_ids=[greedy.token_ids[1]]))
    with pytest.raises(grpc.RpcError):
        stub.Generate(greedy_request([], 2))
    stream = stub.GenerateStream(greedy_request(prompt_ids(20), 200))
    next(stream)
    stream.cancel()
    wait_for(
        lambda: (
            served.scrape().get(
                "ladder_calls_total", protocol="grpc", method="GenerateStream", code="CANCELLED"
            )
            == 1
        )
    )
    m = served.scrape()
    assert m("ladder_finished_total", method="Generate", reason="length") == 1
    assert m("ladder_finished_total", method="Generate", reason="stop") == 1
    assert m("ladder_calls_total", protocol="grpc", method="Generate", code="OK") == 2
    assert m("ladder_calls_total", protocol="grpc", method="Generate", code="INVALID_ARGUMENT") == 1
    assert m.get("ladder_finished_total", method="GenerateStream", reason="length") is None


def test_engine_counters_are_counters_mirrored_from_engine_stats(served: Endpoint) -> None:
    stub = served.running.stub
    stub.Generate(greedy_request(prompt_ids(50, seed=8), 4))
    stats = stub.GetEngineStats(pb.GetEngineStatsRequest())
    m = served.scrape()
    for name in ("hits", "misses", "prepared", "evictions", "refusals"):
        assert m.types[f"ladder_variant_cache_{name}"] == "counter"
        assert m(f"ladder_variant_cache_{name}_total") == getattr(stats.variants, name)
    assert m("ladder_variant_cache_entries") == stats.variants.entries >= 1
    assert m("ladder_variant_cache_capacity") == stats.variants.capacity
    assert m("ladder_decode_forwards_total") == stats.decode.steps >= 3
    assert m("ladder_decode_rows_total") == stats.decode.rows
    assert m("ladder_eager_forwards_total") == stats.eager_forwards
    assert m("ladder_memory_bytes", part="weights") == stats.memory.weights_bytes > 0
    assert m("ladder_memory_bytes", part="kv") == stats.memory.kv_bytes > 0
    assert m("ladder_kv_slots") == 4
    # On CPU every prompt prefills alone: no forward shares prompts, and the stats say why not.
    assert stats.prompt_batches.max_prompts == 1
    assert m("ladder_prompt_batch_forwards_total") == stats.prompt_batches.forwards == 0
    assert m("ladder_prompt_batch_prompts_total") == stats.prompt_batches.prompts == 0


def test_the_model_process_and_no_duplicate_series_are_exported(served: Endpoint) -> None:
    m = served.scrape()
    info = served.running.stub.GetModelInfo(pb.GetModelInfoRequest())
    assert m("ladder_model_info", model=info.model, provider="cpu", pod="pod-a") == 1
    assert m("process_resident_memory_bytes") > 0 and m.types["process_cpu_seconds"] == "counter"
    assert m.types["ladder_time_to_first_token_seconds"] == "histogram"
    assert m.types["ladder_queue_depth"] == "gauge" and m.types["ladder_calls"] == "counter"
    for gone in (
        "ladder_prefill_real_rows",
        "ladder_variants{",
        "ladder_waiting_for_slot",
        "ladder_inter_token_seconds",
    ):
        assert gone not in m.text


def test_every_decode_forward_is_timed_while_calls_share_them(served: Endpoint) -> None:
    stub = served.running.stub
    stub.GetEngineStats(pb.GetEngineStatsRequest())
    before = served.scrape()  # warm-up forwards ran before serving, outside the scheduler
    threads = [
        threading.Thread(target=stub.Generate, args=(greedy_request(prompt_ids(16, seed=s), 6),))
        for s in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stub.GetEngineStats(pb.GetEngineStatsRequest())
    m = served.scrape()
    assert m("ladder_calls_total", protocol="grpc", method="Generate", code="OK") == 3
    assert m("ladder_generated_tokens_total") == 18
    rows = m("ladder_decode_rows_total") - before("ladder_decode_rows_total")
    forwards = m("ladder_decode_forwards_total") - before("ladder_decode_forwards_total")
    assert rows == 15, "each call's 5 later tokens are one decode row each"
    assert m("ladder_decode_step_seconds_count") == forwards, "every decode forward is timed once"


def _documented_metrics() -> set[str]:
    """The ladder_* names docs/observability.md lists (a cell's `_rest_total` after a name shares
    that name's prefix: `ladder_prefix_lookups_total`, `_hits_total`)."""
    names: set[str] = set()
    page = Path(__file__).resolve().parents[2] / "docs" / "observability.md"
    for line in page.read_text().splitlines():
        if not line.startswith(("| `ladder_", "- `ladder_")):
            continue
        prefix = None
        cell = line.split("|")[1] if line[0] == "|" else line
        for name in re.findall(r"`(ladder_[a-z0-9_]+|_[a-z0-9_]+)", cell):
            if name.startswith("ladder_"):
                names.add(name)
                found = re.match(r"(.*)_[a-z0-9]+_total$", name)
                prefix = found.group(1) if found else None
            elif prefix is not None:
                names.add(prefix + name)
    return names


def test_the_observability_page_lists_every_metric_the_server_exports_and_no_other(served: Endpoint) -> None:
    served.running.stub.Generate(greedy_request(prompt_ids(20, seed=41), 2))
    served.running.stub.GetEngineStats(pb.GetEngineStatsRequest())  # the engine's series, mirrored
    exported = {
        name + {"counter": "_total", "info": "_info"}.get(kind, "")
        for name, kind in served.scrape().types.items()
        if name.startswith("ladder_") and not name.endswith("_created")
    }  # prometheus-client's own
    assert exported == _documented_metrics()


def test_a_merged_registry_adds_the_frontends_call_samples_to_its_own_and_nothing_else() -> None:
    ours, frontend_a, frontend_b = Metrics(), Metrics(), Metrics()
    ours.call_done("Generate", grpc.StatusCode.OK, 0.004)
    frontend_a.call_done("Generate", grpc.StatusCode.OK, 0.02)
    frontend_b.call_done("Generate", grpc.StatusCode.OK, 0.02)
    frontend_b.call_done("Decode", grpc.StatusCode.CANCELLED, 3.0)
    frontend_a.generated_tokens.inc(5)  # not a call family: the core counts tokens itself
    ours.registry.others = lambda: [call_families(frontend_a.registry), call_families(frontend_b.registry)]
    text = generate_latest(ours.registry).decode()
    m = Scraped(text)
    assert m("ladder_calls_total", protocol="grpc", method="Generate", code="OK") == 3
    assert m("ladder_calls_total", protocol="grpc", method="Decode", code="CANCELLED") == 1
    assert m("ladder_call_seconds_count", protocol="grpc", method="Generate") == 3
    assert m("ladder_call_seconds_bucket", protocol="grpc", method="Generate", le="0.005") == 1
    assert m("ladder_call_seconds_bucket", protocol="grpc", method="Generate", le="0.025") == 3
    assert m("ladder_call_seconds_sum", protocol="grpc", method="Generate") == pytest.approx(0.044)
    assert m("ladder_generated_tokens_total") == 0
    get = ours.registry.get_sample_value
    assert get("ladder_calls_total", {"protocol": "grpc", "method": "Generate", "code": "OK"}) == 3
    # What the exposition says parses back whole: one family of each name.
    assert len(re.findall(r"^# TYPE ladder_call_seconds histogram$", text, re.M)) == 1
