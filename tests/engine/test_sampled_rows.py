"""The device's sampling kernel (engine.runtime.sampled) draws from exactly the distribution the host's
sampler filters (engine.sampling): chi-squared over many draws for every combination of temperature,
top-k, top-p, min-p and penalties, nothing outside the kept tokens ever; the same tokens whichever
rows share a launch and however many blocks draw a row (a cluster of 1 to 8); the host's tokens at
the same uniforms but where float32 and float64 round differently. Run on the H200 (`-m gpu`); CI
deselects them."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from engine.options import EngineOptions
from engine.runtime.cuda_runtime import CudaUnavailable, Placement, cuda_runtime
from engine.runtime.sampled import CLUSTERS, SampledRows, cluster_size
from engine.sampling import (
    Sampler,
    SamplingParams,
    apply_presence_frequency,
    apply_repetition_penalty,
    filtered_probabilities,
)
from tests.support.draws import COMBINATIONS, assert_drawn_from, named, row_logits

pytestmark = pytest.mark.gpu

DRAWS = 20000
VOCAB = 40


@pytest.fixture(scope="module")
def rt() -> Placement:
    """cupy on a stream of its own: the kernel needs no onnxruntime (its CUDA build or not)."""
    try:
        return cuda_runtime(EngineOptions(provider="cuda"), graphs=False)
    except CudaUnavailable:
        pass
    try:
        import cupy as cp

        cp.cuda.Device(0).use()
        return Placement(cp, "cuda", 0, [], False, cp.cuda.Stream(non_blocking=True))
    except Exception as exc:  # ImportError, or no device
        pytest.fail(f"the gpu tests need CUDA: {exc}")


def launch(
    rt: Placement,
    rows: list[tuple[Any, SamplingParams, int, int]],
    slot: int = -1,
    table: Any = None,
    cluster: int | None = None,
) -> list[int]:
    """One kernel over the rows (device logits row, parameters, key, position); `cluster` blocks
    per row (None: as the kernel chooses for that many rows)."""
    sampled = SampledRows(rt, len(rows), np.float16, int(rows[0][0].shape[-1]))
    sampled.cluster = cluster
    for i, (logits, params, key, position) in enumerate(rows):
        sampled.set(i, logits, params, key, position, slot)
    with rt.enter():
        return sampled.chosen(len(rows), sampled.launch(len(rows), table))


def many(
    rt: Placement,
    logits: Any,
    params: SamplingParams,
    key: int = 5,
    draws: int = DRAWS,
    slot: int = -1,
    table: Any = None,
    cluster: int | None = None,
) -> np.ndarray:
    """`draws` tokens of one row at positions 0..draws-1, in one launch: their histogram."""
    sampled = SampledRows(rt, draws, logits.dtype, int(logits.shape[-1]))
    sampled.cluster = cluster
    sampled.pointers[:draws] = logits.data.ptr
    sampled.f32[:draws] = logits.dtype == np.float32
    sampled.slots[:draws] = slot
    sampled.temperature[:draws] = params.temperature
    sampled.top_k[:draws] = params.top_k
    sampled.top_p[:draws] = params.top_p
    sampled.min_p[:draws] = params.min_p
    sampled.keys[:draws] = key
    sampled.counters[:draws] = np.arange(draws, dtype=np.uint64)
    with rt.enter():
        tokens = sampled.chosen(draws, sampled.launch(draws, table))
    return np.bincount(tokens, minlength=int(logits.shape[-1]))


@pytest.mark.parametrize("cluster", [1, 8])
@pytest.mark.parametrize("params", COMBINATIONS, ids=named)
def test_draws_follow_the_host_s_filtered_distribution_for_every_filter_combination(
    rt, params, cluster
) -> None:
    for dtype in (np.float16, np.float32):
        host = row_logits(1).astype(dtype)
        with rt.enter():
            device = rt.xp.asarray(host)
        assert_drawn_from(many(rt, device, params, cluster=cluster), filtered_probabilities(host, params))


def test_one_row_is_drawn_by_a_cluster_of_eight_blocks_and_many_rows_by_one_each() -> None:
    assert cluster_size(1, 132) == 8
    assert cluster_size(16, 132) == 8
    assert cluster_size(64, 132) == 2
    assert cluster_size(200, 132) == 1
    assert cluster_size(1, 132, (1,)) == 1


@pytest.mark.parametrize("vocab", [40, 1003, 32000, 128256])
def test_a_row_s_token_is_the_same_whichever_cluster_size_draws_it(rt, vocab) -> None:
    """Every block count splits the ids into chunks in id order and sums integers in rank order:
    the same token from 1, 2, 4 or 8 blocks, for every filter, ties at the top-p cut, a constraint,
    float32 rows, greedy rows and rows with nothing finite."""
    rng = np.random.default_rng(vocab)
    flat = (rng.standard_normal(vocab) * 1.0).astype(np.float16)
    peaked = (rng.standard_normal(vocab) * 6.0).astype(np.float16)
    tied = np.zeros(vocab, np.float16)
    tied[rng.choice(vocab, min(vocab, 12), replace=False)] = 3.0
    wide = (rng.standard_normal(vocab) * 2.0).astype(np.float32)
    empty = np.full(vocab, -np.inf, np.float16)
    table = np.ones((2, vocab), bool)
    table[1] = rng.random(vocab) < 0.3
    with rt.enter():
        devices = [rt.xp.asarray(a) for a in (flat, peaked, tied, wide, empty)]
        device_table = rt.xp.asarray(np.packbits(table, axis=-1))  # a bit per token, as MaskTable holds them
    kinds = [
        SamplingParams(temperature=0.8, top_p=0.95, seed=1),
        SamplingParams(temperature=1.0, seed=1),
        SamplingParams(temperature=0.7, top_k=50, top_p=0.9, min_p=0.05, seed=1),
        SamplingParams(temperature=1.0, top_p=0.5, seed=1),
        SamplingParams(),
    ]
    rows = [(devices[(i // len(kinds)) % len(devices)], kinds[i % len(kinds)], 7, i) for i in range(150)]
    for slot in (-1, 1):
        tokens = {c: launch(rt, rows, slot, device_table, cluster=c) for c in CLUSTERS}
        for c in CLUSTERS:
            assert tokens[c] == tokens[1], (vocab, slot, c)


@pytest.mark.parametrize(
    "penalties",
    [
        dict(repetition_penalty=1.3),
        dict(presence_penalty=0.8),
        dict(frequency_penalty=0.5, presence_penalty=-0.4, repetition_penalty=0.8),
    ],
)
def test_penalized_rows_draw_from_the_penalized_distribution(rt, penalties) -> None:
    """The engine makes a penalized row with the host's formulas where the logits are
    (DeviceLogits._penalized), a float32 row the kernel reads beside the store's fp16 ones."""
    params = replace(SamplingParams(temperature=0.9, top_p=0.9, top_k=20, seed=3), **penalties)
    host = row_logits(2).astype(np.float16)
    history, counts = [0, 1, 2, 3, 5, 8, 13], Counter({1: 3, 8: 1, 21: 2})
    on_host = apply_presence_frequency(
        apply_repetition_penalty(host, history, params.repetition_penalty),
        counts,
        params.presence_penalty,
        params.frequency_penalty,
    )
    with rt.enter():
        made = apply_presence_frequency(
            apply_repetition_penalty(rt.xp.asarray(host), history, params.repetition_penalty, rt.xp),
            counts,
            params.presence_penalty,
            params.frequency_penalty,
            rt.xp,
        )
    np.testing.assert_array_equal(rt.to_host(made), on_host)
    assert_drawn_from(many(rt, made, params), filtered_probabilities(on_host, params))


def test_top_p_through_tied_weights_keeps_the_lower_ids_as_the_host_does(rt) -> None:
    host = np.zeros(VOCAB, np.float16)
    host[[3, 9, 17, 30]] = 2.0  # four equal most likely: a top-p of 0.5 keeps the lower two or three
    for top_p in (0.3, 0.5, 0.72):
        params = SamplingParams(temperature=1.0, top_p=top_p, seed=2)
        with rt.enter():
            device = rt.xp.asarray(host)
        assert_drawn_from(many(rt, device, params), filtered_probabilities(host, params))


def test_constrained_rows_draw_only_allowed_tokens_in_the_allowed_distribution(rt) -> None:
    host = row_logits(4)
    table = np.ones((3, VOCAB), bool)
    table[2] = np.random.default_rng(0).random(VOCAB) < 0.4
    params = SamplingParams(temperature=1.2, top_p=0.95, seed=9)
    with rt.enter():
        device, device_table = rt.xp.asarray(host), rt.xp.asarray(np.packbits(table, axis=-1))
    expected = filtered_probabilities(np.where(table[2], host, np.float32(-np.inf)), params)
    assert_drawn_from(many(rt, device, params, slot=2, table=device_table), expected)


def test_a_row_s_token_is_the_same_alone_and_beside_any_other_rows(rt) -> None:
    rng = np.random.default_rng(3)
    with rt.enter():
        rows = [rt.xp.asarray((rng.standard_normal(32000) * s).astype(np.float16)) for s in (1.0, 3.0, 8.0)]
    mine = (rows[1], SamplingParams(temperature=0.8, top_p=0.95, seed=11), 11, 300)
    for position in range(50):
        me = (mine[0], mine[1], mine[2], position)
        alone = launch(rt, [me])
        others = [
            (
                rows[i % 3],
                SamplingParams(temperature=0.3 + i / 50, top_k=i % 40, top_p=0.5 + i / 200, seed=i),
                i,
                position + i,
            )
            for i in range(63)
        ]
        beside = launch(rt, [*others[:20], me, *others[20:]])
        different = launch(rt, [me, *others[::-1][:10]])
        assert alone == [beside[20]] == [different[0]], position


def test_the_device_draws_the_host_s_tokens_but_at_rounding_edges(rt) -> None:
    rng = np.random.default_rng(8)
    agree = total = 0
    for vocab, scale in ((32000, 1.0), (32000, 4.0), (128256, 2.0)):
        host = (rng.standard_normal(vocab) * scale).astype(np.float16)
        with rt.enter():
            device = rt.xp.asarray(host)
        params = SamplingParams(temperature=0.8, top_p=0.95, seed=21)
        rows = [(device, params, 21, position) for position in range(300)]
        on_device = launch(rt, rows)
        sampler = Sampler(params)
        on_host = [sampler(host, range(position)) for position in range(300)]
        agree += sum(a == b for a, b in zip(on_device, on_host, strict=True))
        total += len(rows)
    assert agree >= 0.99 * total, (agree, total)


def test_greedy_rows_and_rows_with_nothing_finite_take_numpy_s_argmax(rt) -> None:
    host = row_logits(6)
    host[[4, 11]] = host.max() + 1  # a tie at the top: the first
    empty = np.full(VOCAB, -np.inf, np.float32)
    infinite = row_logits(7)
    infinite[[2, 33]] = np.inf
    with rt.enter():
        devices = [rt.xp.asarray(a) for a in (host, empty, infinite)]
    rows = [
        (devices[0], SamplingParams(), 0, 0),
        (devices[0], SamplingParams(temperature=1.0, top_k=1), 0, 0),
        (devices[1], SamplingParams(temperature=1.0, seed=1), 1, 0),
    ]
    assert launch(rt, rows) == [4, 4, 0]
    assert set(np.flatnonzero(many(rt, devices[2], SamplingParams(temperature=1.0), draws=400))) == {2, 33}
