"""What a verification forward costs on CPU (issue #44): one forward of w rows with logits on every
row (a speculating step checks k = w - 1 drafted tokens) against a one-row step, on the graph the
engine runs for the default model, zero KV of `past` tokens, median of 30 after 3 warm-up runs.

    python -m bench.experiments.verify_cost --cache-root .pytest_cache/d/ladder-default-model
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from engine.default_model import prepare
from engine.executor import Engine, EngineOptions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-root", type=Path, required=True)
    parser.add_argument("--precision", default="int4")
    parser.add_argument("--widths", default="1,3,5,9")
    parser.add_argument("--pasts", default="256,1024")
    args = parser.parse_args()
    info = Engine.load(prepare(args.cache_root, precision=args.precision).model_dir, EngineOptions()).info
    session = ort.InferenceSession(str(info.graph), providers=["CPUExecutionProvider"])
    wanted = {i.name for i in (*session.get_inputs(), *session.get_overridable_initializers())}
    out: dict[str, float] = {}
    for past in (int(p) for p in args.pasts.split(",")):
        kv = np.zeros((1, info.num_kv_heads, past, info.head_size), np.float32)
        for width in (int(w) for w in args.widths.split(",")):
            feeds = {
                "input_ids": np.random.default_rng(0).integers(3, info.vocab_size, (1, width)),
                "attention_mask": np.ones((1, past + width), np.int64),
                "logits_rows": np.arange(width, dtype=np.int64),
                **{name: kv for pair in info.kv_inputs for name in pair},
            }
            feeds = {k: v for k, v in feeds.items() if k in wanted}
            for _ in range(3):
                session.run(["logits"], feeds)
            times = []
            for _ in range(30):
                started = time.perf_counter()
                session.run(["logits"], feeds)
                times.append(time.perf_counter() - started)
            out[f"past{past}-w{width}"] = round(float(np.median(times)) * 1e3, 2)
            print(f"past {past} width {width}: {out[f'past{past}-w{width}']} ms", flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
