"""KV copies on the device: host time per call and device time, the copy kernel against cupy's slice
assignment (fp16 elements, and the 16-byte words of the form before the kernel), on the 3B-class
decoder's pool (28 layers, 8 KV heads of 128, capacity 8192, 8 rows) and its one-row staging block:
a prefill forward's staging store (512 positions), a staging load of a 2,000-token past, a fork of
4,000 positions between pool rows.

    python -m bench.gpu.kv_copy --out $OUT
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.served import machine
from engine.executor import EngineOptions
from engine.runtime.cuda_runtime import cuda_runtime


def slice_copy(dst: Any, dst_row: int, src: Any, src_row: int, start: int, stop: int) -> None:
    """cupy's slice assignment, the form before the copy kernel."""
    dst[:, :, dst_row, :, start:stop] = src[:, :, src_row, :, start:stop]


def timed(rt: Any, copy: Any, repeats: int) -> dict[str, float]:
    host, device = [], []
    for _ in range(repeats):
        rt.wait_queue()
        start = time.perf_counter()
        copy()
        launched = time.perf_counter()
        rt.wait_queue()
        host.append((launched - start) * 1e6)
        device.append((time.perf_counter() - start) * 1e3)
    return {"host_us": round(statistics.median(host), 1), "with_wait_ms": round(statistics.median(device), 3)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    rt = cuda_runtime(EngineOptions(provider="cuda"))
    xp = rt.xp
    layers, heads, capacity, head, rows = 28, 8, 8192, 128, 8
    with rt.enter():
        pool = xp.zeros((layers, 2, rows, heads, capacity, head), np.float16)
        staging = xp.zeros((layers, 2, 1, heads, capacity, head), np.float16)
        wide = {id(pool): pool.view(xp.complex128), id(staging): staging.view(xp.complex128)}
        # name: (destination, its row, source, its row, first position, end)
        cases = {
            "staging store, 512 positions": (pool, 3, staging, 0, 1536, 2048),
            "staging load, 2000 positions": (staging, 0, pool, 2, 0, 2000),
            "fork, 4000 positions": (pool, 5, pool, 1, 0, 4000),
        }
        results: dict[str, Any] = {}
        for name, (dst, dst_row, src, src_row, first, end) in cases.items():
            kernel = functools.partial(rt.copy_positions, dst, dst_row, src, src_row, first, end)
            fp16 = functools.partial(slice_copy, dst, dst_row, src, src_row, first, end)
            words = functools.partial(slice_copy, wide[id(dst)], dst_row, wide[id(src)], src_row, first, end)
            for warm in (kernel, fp16, words):
                warm()
            results[name] = {
                "kernel": timed(rt, kernel, args.repeats),
                "slice_fp16": timed(rt, fp16, args.repeats),
                "slice_16_byte_words": timed(rt, words, args.repeats),
            }
    out = {"machine": machine(), "pool_shape": list(pool.shape), "results": results}
    print(json.dumps(out, indent=2))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kv-copy.json").write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
