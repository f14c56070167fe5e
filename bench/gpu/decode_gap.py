"""Where a steady B-row decode step's time goes on the device, beyond onnxruntime's raw replay.

The engine alone (no gRPC, no scheduler): B sessions prefilled with 512 tokens, then `--steps`
decode steps of all of them: chained (the default: a greedy step queues its choice and the next
forward on the device, decode.py), lookahead without the chain, and neither. Each of the step's
stages is timed on the host by wrapping it (time.perf_counter around the call, summed): waiting
for the forward in flight (`settle`), keeping the rows' logits (`keep_batch`), choosing the
tokens (`choose`: the device argmax and the copy of B ids to the host), setting the masks and ids
of the next forward (`masks`), launching it (`run_batch`); or, chained, all of that queued at once
(`chain_batch`, which returns once the tokens are chosen). What is left of the step is the
engine's own bookkeeping.
Beside it, in the same process, onnxruntime's raw replay of one B-row step (bench/batching).

    python3 -m bench.gpu.decode_gap --model 16x2048 --rows 64 --out $OUT
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from bench.batching import raw_replay
from bench.gpu.run import build
from bench.served import vocab_of
from bench.stages import timed
from engine.executor import DecodeRow, EngineOptions
from engine.executor.engine import Engine
from engine.sampling import Sampler, SamplingParams


def steady(engine: Engine, rows: int, prompt: int, steps: int, vocab: int) -> dict[str, Any]:
    greedy = Sampler(SamplingParams())
    rng = np.random.default_rng(0)
    sessions = [engine.open_session() for _ in range(rows)]
    last = []
    for session in sessions:
        engine.append(session, rng.integers(3, vocab, prompt).tolist())
        last.append(engine.choose(session, greedy))
    totals: dict[str, float] = defaultdict(float)
    backend, decoder = engine.backend, engine.decoder
    for name, owner, attr in (
        ("settle", backend, "settle"),
        ("keep_batch", backend, "keep_batch"),
        ("choose", backend, "choose"),
        ("masks", decoder, "_masks"),
        ("run_batch", backend, "run_batch"),
        ("chain_batch", backend, "chain_batch"),
    ):
        timed(totals, name, owner, attr)
    for _ in range(10):
        last = engine.decode([DecodeRow(s, t, greedy) for s, t in zip(sessions, last, strict=True)])
    totals.clear()
    start = time.perf_counter()
    for _ in range(steps):
        last = engine.decode([DecodeRow(s, t, greedy) for s, t in zip(sessions, last, strict=True)])
    wall = time.perf_counter() - start
    for session in sessions:
        engine.close_session(session, keep=False)
    stages = {name: seconds / steps * 1e3 for name, seconds in totals.items()}
    return {
        "step_ms": wall / steps * 1e3,
        "tok_s": rows * steps / wall,
        "stages_ms": stages,
        "rest_ms": wall / steps * 1e3 - sum(stages.values()),
        "lookahead": {
            "hits": decoder.counters.lookahead_hits,
            "chained": decoder.counters.chained,
            "launched": decoder.counters.lookahead_launched,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="16x2048")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--capacity", type=int, default=4608)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    path = build(args.model, Path("/tmp/ladder-gpu-models"))
    vocab = vocab_of(path)
    result: dict[str, Any] = {
        "model": args.model,
        "rows": args.rows,
        "command": (
            f"python3 -m bench.gpu.decode_gap --model {args.model} --rows {args.rows} --steps {args.steps}"
        ),
    }
    modes = (("chained", True, True), ("lookahead", True, False), ("stepwise", False, False))
    for key, lookahead, chain in modes:
        engine = Engine.load(
            path,
            EngineOptions(
                provider="cuda", capacity=args.capacity, max_sessions=args.rows, lookahead=lookahead
            ),
        )
        engine.backend.chains = chain  # type: ignore[misc]  # the chain off: lookahead as before it
        engine.warm_up()
        result[key] = steady(engine, args.rows, args.prompt, args.steps, vocab)
        print(key, json.dumps(result[key]), flush=True)
        engine.close()
    result["raw_replay"] = raw_replay(path, [args.rows], args.capacity, args.prompt)[str(args.rows)]
    result["engine_over_raw"] = {
        key: result["raw_replay"]["step_ms"] / result[key]["step_ms"]
        for key in ("chained", "lookahead", "stepwise")
    }
    print("raw", json.dumps(result["raw_replay"]), "engine/raw", result["engine_over_raw"], flush=True)
    (args.out / f"decode-gap-{args.model}-{args.rows}.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
