"""The seed's experiment on CPU: prompt lengths run twice, padding on vs off, side by side.

Reports per pass: wall time of the prefills, variants prepared, evictions, the
bytes the cache holds, and process peak RSS. One run, both settings, same model.

    python -m bench.experiments.seed_experiment \
        --out bench/results/seed-experiment-cpu-<date>/seed-experiment.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import time
from dataclasses import replace
from datetime import date
from pathlib import Path

import numpy as np

from engine.executor import EngineOptions
from engine.executor.engine import Engine
from engine.modelgen.synthetic import TINY, build_synthetic

SPEC = replace(
    TINY,
    vocab_size=32000,
    hidden_size=512,
    intermediate_size=1408,
    num_layers=4,
    num_heads=8,
    num_kv_heads=4,
    head_size=64,
    rotary_rows=8192,
)
LENGTHS = (40, 146, 311, 378, 1041, 1137, 1200, 1500, 523, 700, 901, 88)


def run_pass(engine: Engine, lengths: tuple[int, ...]) -> dict[str, float]:
    before = engine.stats().variants
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for length in lengths:
        session = engine.open_session()
        logits = engine.append(session, [int(t) for t in rng.integers(0, SPEC.vocab_size, length)])
        for _ in range(4):
            logits = engine.append(session, [int(np.argmax(logits))])
        engine.close_session(session)
    after = engine.stats().variants
    return {
        "seconds": time.perf_counter() - start,
        "prepared": after.prepared - before.prepared,
        "evictions": after.evictions - before.evictions,
        "entries": len(after.entries),
        "cache_bytes": after.nbytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--chunk", type=int, default=512)
    args = parser.parse_args()
    model = build_synthetic(
        SPEC, Path.home() / ".cache" / "ladder" / "bench", chunk_size=args.chunk, context_length=8192
    )
    engines = {}
    for name, padding in (("on", True), ("off", False)):
        engines[name] = Engine.load(model, EngineOptions(padding=padding, capacity=4096, max_sessions=1))
        warm = engines[name].open_session()
        engines[name].append(warm, [1, 2, 3])  # touch the weights before timing
        engines[name].close_session(warm)
    results: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
    for _ in range(2):  # passes alternate between the settings so noise hits both alike
        for name, engine in engines.items():
            results[name].append(run_pass(engine, LENGTHS))
    report = {
        "date": date.today().isoformat(),
        "machine": f"{platform.node()} {platform.machine()}",
        "cpus": os.cpu_count(),
        "model": "random GQA 4x512, vocab 32000",
        "chunk": args.chunk,
        "lengths": LENGTHS,
        "results": results,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
