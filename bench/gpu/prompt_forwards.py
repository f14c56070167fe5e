"""What one prefill forward of B new prompts costs on the device, B = 1, 2, 4, 8 (16): the engine's
own forwards (graph replays after warm-up), timed end to end on the host, N repeats each, median.
From it: prefill tokens/s at each B, and the TTFT a burst of P prompts of that width could reach
at best (the median prompt waits for half the burst's forwards: P/2/B forwards).

    python3 -m bench.gpu.prompt_forwards --model 16x2048 --width 512 --out $OUT
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from bench.gpu.run import build
from engine.executor import EngineOptions
from engine.executor.engine import Engine
from engine.executor.step import Open


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="16x2048")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--sizes", default="1,2,4,8")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--burst", type=int, default=64)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    path = build(args.model, Path("/tmp/ladder-gpu-models"))
    engine = Engine.load(
        path,
        EngineOptions(
            provider="cuda",
            capacity=2048,
            max_sessions=max(sizes),
            prefill_batch=max(sizes),
            chunk_size=args.width,
        ),
    )
    engine.warm_up()
    rng = np.random.default_rng(0)
    out: dict[str, object] = {"model": args.model, "width": args.width, "sizes": {}}
    for size in sizes:
        times = []
        for _ in range(args.repeats):
            sessions = engine.open_sessions(Open(count=size))
            tasks = [engine.start_prefill(s, rng.integers(3, 32000, args.width).tolist()) for s in sessions]
            start = time.perf_counter()
            if size == 1:
                engine.prefill_step(tasks[0])
            else:
                engine.prefill_prompts(tasks, size)
            engine.backend.rt.wait_device()
            times.append(time.perf_counter() - start)
            for session in sessions:
                engine.close_session(session, keep=False)
        ms = 1e3 * statistics.median(times)
        forwards = args.burst / size
        entry = {
            "ms": ms,
            "tok_s": size * args.width / ms * 1e3,
            f"burst{args.burst}_ttft_p50_floor_ms": ms * forwards / 2,
            f"burst{args.burst}_all_ms": ms * forwards,
        }
        out["sizes"][str(size)] = entry  # type: ignore[index]
        print(size, json.dumps(entry), flush=True)
    out["eager_forwards"] = engine.stats().eager_forwards
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"prompt-forwards-{args.model}-{args.width}.json"
    (args.out / name).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
