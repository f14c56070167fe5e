"""bench/serving.py's pure parts: the workload it draws and the figures it reports."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from bench.serving import (
    Record,
    Slo,
    arrivals,
    busiest_threads,
    interleave,
    lognormal,
    meets,
    percentiles,
    ratio,
    summarize,
    window_rate,
    workload,
)

SLO = Slo(ttft_ms=100, itl_ms=20)


def record(ttft_s: float, gap_s: float, tokens: int, error: str = "") -> Record:
    return Record(0.0, [ttft_s + i * gap_s for i in range(tokens)], error)


def test_goodput_counts_only_requests_within_both_slos() -> None:
    records = [
        record(0.05, 0.01, 10),
        record(0.5, 0.01, 10),
        record(0.05, 0.5, 10),
        record(0.05, 0.01, 10, error="RESOURCE_EXHAUSTED"),
    ]
    found = summarize(records, duration=2.0, slo=SLO)
    assert [meets(r, SLO) for r in records] == [True, False, False, False]
    assert found["goodput_request_s"] == pytest.approx(0.5)
    assert found["good_fraction"] == pytest.approx(0.25)
    assert found["errors"] == 1


def test_unserved_requests_are_counted_by_what_they_got() -> None:
    failed = record(0.05, 0.01, 2, error="UNAVAILABLE")
    failed.detail = "'closed' after 70.0 ms and 2 tokens"
    records = [record(0.05, 0.01, 3), record(0.05, 0.01, 0), failed]
    found = summarize(records, duration=1.0, slo=SLO)
    assert found["errors"] == 2
    assert found["error_kinds"] == {"no tokens": 1, "UNAVAILABLE": 1}
    assert found["error_examples"] == ["UNAVAILABLE: 'closed' after 70.0 ms and 2 tokens"]


def test_a_failed_request_adds_no_tokens_and_no_latency() -> None:
    served = [record(0.05, 0.01, 10)]
    alone, with_failure = (summarize(r, 1.0, SLO) for r in (served, served + [record(9.0, 9.0, 3, "X")]))
    for key in ("output_tok_s", "ttft_ms", "itl_ms", "e2e_ms", "request_s"):
        assert alone[key] == with_failure[key]


def test_percentiles_are_ordered_and_in_milliseconds() -> None:
    found = percentiles(list(np.random.default_rng(0).exponential(0.1, 500)), (50, 90, 99))
    assert found["p50"] <= found["p90"] <= found["p99"]
    assert 50 < found["p50"] < 100  # the median of exponential(0.1 s) is 69 ms
    assert percentiles([], (50,)) == {"p50": None}


def test_poisson_arrivals_start_at_zero_and_average_the_rate() -> None:
    offsets = arrivals(4000, 5.0, np.random.default_rng(1))
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    assert 4000 / offsets[-1] == pytest.approx(5.0, rel=0.05)
    assert arrivals(3, float("inf"), np.random.default_rng(1)) == [0.0, 0.0, 0.0]


def test_lognormal_lengths_keep_their_mean_and_bounds() -> None:
    lengths = lognormal(np.random.default_rng(2), 161, 20000, cap=100_000)
    assert np.mean(lengths) == pytest.approx(161, rel=0.05)
    assert min(lognormal(np.random.default_rng(2), 10, 1000, cap=12)) >= 4
    assert max(lognormal(np.random.default_rng(2), 10, 1000, cap=12)) <= 12


def test_the_same_seed_draws_the_same_requests() -> None:
    args = argparse.Namespace(capacity=2048, prompt_len=0, output_len=0, scale=0.25)
    assert workload(args, 20, 3, 49152) == workload(args, 20, 3, 49152)
    assert workload(args, 20, 3, 49152) != workload(args, 20, 4, 49152)


def test_the_protocol_ratio_pairs_rounds_in_order() -> None:
    rounds = [
        {"protocol": p, "output_tok_s": v}
        for p, v in (("grpc", 100), ("http", 90), ("grpc", 200), ("http", 200))
    ]
    found = ratio(rounds)
    assert found["pairs"] == [0.9, 1.0]
    assert found["of_medians"] == pytest.approx(145 / 150)


def test_the_window_rate_counts_only_tokens_while_requests_arrive() -> None:
    # sent at 0 and 2 s: of the tokens, 0.5 and 1.5 came while requests arrived, 2 over 2 s
    records = [Record(0.0, [0.5, 1.5, 2.5]), Record(2.0, [2.1, 3.0])]
    assert window_rate(records) == pytest.approx(1.0)
    assert window_rate([Record(0.0, [0.5]), Record(0.0, [0.7])]) is None  # a burst has no window


def test_records_split_over_processes_come_back_in_request_order() -> None:
    requests = [Record(float(i)) for i in range(7)]
    parts = [requests[k::3] for k in range(3)]  # what process k of 3 sent
    assert interleave(parts) == requests


def test_the_core_threads_shown_and_the_rest_add_up_to_the_process_cores() -> None:
    before = {0: 1.0, 11: 5.0, 12: 0.0, 13: 0.5, 14: 0.1}
    after = {0: 1.5, 11: 9.0, 12: 0.2, 13: 0.6, 14: 0.1, 15: 0.3}  # 15 started during the run
    shown = busiest_threads(before, after, wall=2.0, shown=2)
    assert shown[:2] == [["11", 2.0], ["main", 0.25]]
    assert shown[2][0] == "rest (4 threads)"
    spent = sum(after.values()) - sum(before.values())
    assert sum(cores for _, cores in shown) == pytest.approx(spent / 2.0)
