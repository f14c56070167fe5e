"""The sampling kernel's device time (engine/runtime/sampled.py) against the greedy argmax's
(engine/runtime/greedy.py), per launch, for 1/16/64 rows of 32k and 128k fp16 logits, with the
cluster size the kernel chooses and, for top-p, each cluster size (blocks per row); and the host's
time to fill a launch's parameters. cupy events around 200 launches each, after 20 unmeasured.

    python3 -m bench.gpu.sample_kernel --out $OUT/sample-kernel.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.served import machine
from engine.runtime.cuda_runtime import Placement
from engine.runtime.greedy import GreedyRows
from engine.runtime.sampled import SampledRows, cluster_size
from engine.sampling import SamplingParams

LAUNCHES = 200


def timed(rt: Placement, launch: Any) -> float:
    """Mean device milliseconds of one launch."""
    xp = rt.xp
    with rt.enter():
        for _ in range(20):
            launch()
        start, stop = xp.cuda.Event(), xp.cuda.Event()
        start.record(rt.stream)
        for _ in range(LAUNCHES):
            launch()
        stop.record(rt.stream)
        stop.synchronize()
    return float(xp.cuda.get_elapsed_time(start, stop)) / LAUNCHES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import cupy as cp

    rt = Placement(cp, "cuda", 0, [], False, cp.cuda.Stream(non_blocking=True))
    rows_out: list[dict[str, Any]] = []
    kinds = {
        "top_p 0.95, t 0.8": SamplingParams(temperature=0.8, top_p=0.95, seed=1),
        "t 1.0": SamplingParams(temperature=1.0, seed=1),
        "top_k 50, top_p 0.9, min_p 0.05": SamplingParams(
            temperature=0.7, top_k=50, top_p=0.9, min_p=0.05, seed=1
        ),
    }
    for vocab in (32000, 128256):
        for scale in (1.0, 6.0):  # random-weight-like flat rows, trained-like peaked rows
            with rt.enter():
                host = np.random.default_rng(0).standard_normal((64, vocab)) * scale
                store = cp.asarray(host.astype(np.float16))
            greedy = GreedyRows(rt, 64, np.float16)
            sampled = SampledRows(rt, 64, np.float16, vocab)
            for n in (1, 16, 64):
                rows = list(range(n))
                greedy.rows[:n] = rows
                greedy.slots[:n] = -1
                argmax = timed(rt, lambda g=greedy, s=store, n=n: g._launch(s, n, 0))
                entry: dict[str, Any] = {"vocab": vocab, "scale": scale, "rows": n, "argmax_ms": argmax}
                for name, params in kinds.items():
                    addresses = [store.data.ptr + r * store.strides[0] for r in rows]
                    started = time.perf_counter()
                    for _ in range(100):
                        sampled.fill(0, addresses, [False] * n, [params] * n, [1] * n, list(range(n)))
                    entry[f"fill_us {name}"] = (time.perf_counter() - started) / 100 * 1e6
                    sampled.cluster = None
                    entry[f"sample_ms {name}"] = timed(rt, lambda s=sampled, n=n: s.launch(n))
                    if name.startswith("top_p 0.95"):
                        for size in sampled.sizes:
                            sampled.cluster = size
                            entry[f"cluster {size} ms {name}"] = timed(rt, lambda s=sampled, n=n: s.launch(n))
                        sampled.cluster = None
                entry["cluster"] = cluster_size(n, sampled.processors, sampled.sizes)
                rows_out.append(entry)
                print(json.dumps(entry), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine(), "results": rows_out}, indent=1))


if __name__ == "__main__":
    main()
