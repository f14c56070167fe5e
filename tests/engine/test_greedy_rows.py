"""The one greedy kernel (engine.runtime.greedy) chooses what numpy's argmax chooses: over a row's
allowed tokens, the first of the largest logits, a NaN counting as largest; rows without a
constraint see every token. Checked on numpy here and on the device's kernel on the H200 (`gpu`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engine.options import EngineOptions
from engine.runtime.cuda_runtime import CudaUnavailable, Placement, cuda_runtime, host_runtime
from engine.runtime.greedy import GreedyRows

VOCAB = 1001  # not a multiple of 8: the last byte of a packed mask is part padding
ROWS = 16


def expected(store: np.ndarray, rows: list[int], slots: list[int], table: np.ndarray) -> list[int]:
    out = []
    for row, slot in zip(rows, slots, strict=True):
        logits = store[row].astype(np.float32)
        if slot >= 0:
            logits = np.where(table[slot], logits, np.float32(-np.inf))
        out.append(int(np.argmax(logits)))
    return out


def packed(table: np.ndarray) -> np.ndarray:
    """Masks as the device table holds them (engine.runtime.masks): a bit per token."""
    return np.packbits(table, axis=-1)


def case(dtype: Any, seed: int) -> tuple[np.ndarray, list[int], list[int], np.ndarray]:
    """Logits with ties (values on a coarse grid), a NaN in one row, an all-equal row; masks that
    refuse the top token of some rows; rows in no order with gaps; some rows unconstrained."""
    rng = np.random.default_rng(seed)
    store = rng.integers(-8, 8, (ROWS, VOCAB)).astype(dtype)  # many ties at the top
    store[3, 500] = np.nan
    store[5] = 1
    table = rng.random((6, VOCAB)) < 0.3
    table[0] = True
    rows = [int(r) for r in rng.permutation(ROWS)[:12]]
    slots = [int(s) for s in rng.integers(-1, 6, len(rows))]
    return store, rows, slots, table


def test_greedy_rows_on_the_host_choose_what_numpy_argmax_chooses() -> None:
    for dtype in (np.float32, np.float16):
        for seed in range(5):
            store, rows, slots, table = case(dtype, seed)
            greedy = GreedyRows(host_runtime(), ROWS, dtype)
            assert greedy(store, rows, slots, packed(table)) == expected(store, rows, slots, table)


def test_a_row_without_a_constraint_reads_no_mask() -> None:
    store, rows, _, _ = case(np.float32, 9)
    greedy = GreedyRows(host_runtime(), ROWS, np.float32)
    assert greedy(store, rows, [-1] * len(rows), None) == [int(np.argmax(store[r])) for r in rows]


@pytest.mark.gpu
def test_the_device_kernel_chooses_what_numpy_argmax_chooses() -> None:
    try:
        rt: Placement = cuda_runtime(EngineOptions(provider="cuda"), graphs=False)
    except CudaUnavailable as exc:
        pytest.fail(f"the gpu tests need CUDA: {exc}")
    xp = rt.xp
    for dtype in (np.float32, np.float16):
        for seed in range(20):
            store, rows, slots, table = case(dtype, seed)
            greedy = GreedyRows(rt, ROWS, dtype)
            with rt.enter():
                on_device = greedy(xp.asarray(store), rows, slots, xp.asarray(packed(table)))
            assert on_device == expected(store, rows, slots, table), (dtype, seed)
    big = np.random.default_rng(1).standard_normal((4, 128_256)).astype(np.float16)  # a Llama-3 vocabulary
    greedy = GreedyRows(rt, 4, np.float16)
    order = [3, 0, 2, 1]
    with rt.enter():
        assert greedy(xp.asarray(big), order, [-1] * 4, None) == [int(np.argmax(big[r])) for r in order]
