"""Does onnxruntime run its forwards on the CUDA stream the backend offers it (`user_compute_stream`)?

The engine's B-row decode variant (a captured graph, and the same forward eager) is launched with
onnxruntime's end-of-run sync switched off, between two cupy events recorded on the backend's
stream. If the forward runs on that stream, the events enclose it: their elapsed time is the
forward's. A copy of the logits queued on the stream right after the launch is then the forward's
output, not the previous forward's: each launch feeds other tokens, and the copy is compared with
the logits read once the device is idle.

    python3 -m bench.gpu.stream_order --model 16x2048 --rows 64 --out $OUT
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.gpu.run import build
from bench.served import vocab_of
from engine.executor import DecodeRow, EngineOptions
from engine.executor.engine import Engine
from engine.runtime.forwards import EAGER
from engine.runtime.variants import VariantKey
from engine.sampling import Sampler, SamplingParams


def probe(engine: Engine, rows: int, graph: bool, trials: int, vocab: int) -> dict[str, Any]:
    backend: Any = engine.backend
    cp, stream = backend.xp, backend.rt.stream
    key = VariantKey(1, (), rows)
    variant = engine.decoder.variant(key) if graph else backend._variant(key, EAGER)
    options = backend.forwards.options(variant.graph_id, False)
    feed = variant.inputs[engine.info.feed.name]
    rng = np.random.default_rng(1)
    enclosed, agree, launch = [], 0, []
    with stream:
        for _ in range(trials):
            backend.rt.wait_device()
            feed[:] = rng.integers(3, vocab, feed.shape)
            before, after = cp.cuda.Event(), cp.cuda.Event()
            before.record(stream)
            t0 = time.perf_counter()
            backend.session.run_with_iobinding(variant.binding, options)
            launch.append((time.perf_counter() - t0) * 1e3)
            after.record(stream)
            chained = variant.logits.copy()  # queued behind the forward if it runs on this stream
            after.synchronize()
            enclosed.append(cp.cuda.get_elapsed_time(before, after))
            backend.rt.wait_device()
            agree += bool(cp.array_equal(chained, variant.logits))
    # The same forward waited for: its time on the device, for comparison.
    backend.rt.wait_device()
    t0 = time.perf_counter()
    for _ in range(trials):
        backend.session.run_with_iobinding(variant.binding, backend.forwards.options(variant.graph_id, True))
    waited = (time.perf_counter() - t0) / trials * 1e3
    return {
        "graph": graph,
        "events_enclose_ms_median": float(np.median(enclosed)),
        "launch_ms_median": float(np.median(launch)),
        "waited_forward_ms": waited,
        "chained_copy_agrees": f"{agree}/{trials}",
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="16x2048")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    path = build(args.model, Path("/tmp/ladder-gpu-models"))
    vocab = vocab_of(path)
    engine = Engine.load(path, EngineOptions(provider="cuda", capacity=2048, max_sessions=args.rows))
    engine.warm_up()
    greedy = Sampler(SamplingParams())
    sessions = [engine.open_session() for _ in range(args.rows)]
    last = []
    for session in sessions:
        engine.append(session, [5, 6, 7])
        last.append(engine.choose(session, greedy))
    last = engine.decode([DecodeRow(s, t, greedy, more=False) for s, t in zip(sessions, last, strict=True)])
    engine.decoder.settle()
    result = {
        "model": args.model,
        "rows": args.rows,
        "command": f"python3 -m bench.gpu.stream_order --model {args.model} --rows {args.rows}",
        "runs": [probe(engine, args.rows, graph, args.trials, vocab) for graph in (True, False)],
    }
    print(json.dumps(result, indent=2), flush=True)
    (args.out / f"stream-order-{args.model}-{args.rows}.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
