"""Host time of one seeded draw (engine.sampling.Sampler) per row: temperature, top-k and top-p, on
peaked and flat rows of a 32k and a 128k vocabulary, top-p with its head sort (`nucleus`) beside the
sort of every token it replaced, alternated in one run.

    python -m bench.cpu.sampling --out bench/results/sampling-2026-12-02
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np

import engine.sampling
from engine.sampling import Sampler, SamplingParams


def full_sort(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Top-p as first written: every token sorted."""
    order = np.argsort(-probs, kind="stable")
    return order[: int(np.searchsorted(np.cumsum(probs[order]), top_p)) + 1]


def draw_ms(logits: np.ndarray, params: SamplingParams, draws: int) -> float:
    sampler = Sampler(params)
    sampler(logits)
    start = time.perf_counter()
    for _ in range(draws):
        sampler(logits)
    return (time.perf_counter() - start) / draws * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--draws", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    head_sort = engine.sampling.nucleus
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []
    for vocab in (32000, 128256):
        for shape, scale in (("peaked", 6.0), ("peaked", 3.0), ("flat", 1.0)):
            logits = (rng.standard_normal(vocab) * scale).astype(np.float32)
            for name, params in (
                ("temperature 0.7", SamplingParams(temperature=0.7, seed=1)),
                ("top_k 50", SamplingParams(temperature=0.7, top_k=50, seed=1)),
                ("top_p 0.9", SamplingParams(temperature=0.7, top_p=0.9, seed=1)),
            ):
                times: dict[str, list[float]] = {"head sort": [], "full sort": []}
                for _ in range(args.repeats):  # alternated: the machine's noise falls on both
                    for mode, fn in (("head sort", head_sort), ("full sort", full_sort)):
                        engine.sampling.nucleus = fn  # type: ignore[assignment]
                        times[mode].append(draw_ms(logits, params, args.draws))
                engine.sampling.nucleus = head_sort
                row = {
                    "vocab": vocab,
                    "rows": f"{shape} (N(0,1) x {scale})",
                    "params": name,
                    "ms": {mode: min(t) for mode, t in times.items()},
                }
                row["full_over_head"] = row["ms"]["full sort"] / row["ms"]["head sort"]
                rows.append(row)
                print(json.dumps(row), flush=True)
    result = {
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}",
        "command": f"python -m bench.cpu.sampling --draws {args.draws} --repeats {args.repeats}",
        "rows": rows,
    }
    (args.out / "sampling.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
