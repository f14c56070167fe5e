"""Where one prefill forward of the default model spends its time, by operator (onnxruntime's profiler).

Loads the graph the engine runs (the read-rows copy in a temporary graph cache), feeds one forward of
`--width` rows on `--past` tokens of zero KV, runs it `--runs` times and prints the mean time per op type.

    python -m bench.cpu.profile_forward --cache-root .pytest_cache/d/ladder-default-model --precision int4
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from engine.default_model import prepare
from engine.executor import EngineOptions
from engine.executor.engine import Engine


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cache-root", type=Path, required=True)
    parser.add_argument("--precision", default="int4")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--past", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    engine = Engine.load(prepare(args.cache_root, precision=args.precision).model_dir, EngineOptions())
    info = engine.info
    with tempfile.TemporaryDirectory() as trace_dir:
        so = ort.SessionOptions()
        so.enable_profiling, so.profile_file_prefix = True, str(Path(trace_dir) / "forward")
        session = ort.InferenceSession(str(info.graph), so, providers=["CPUExecutionProvider"])
        past = np.zeros((1, info.num_kv_heads, args.past, info.head_size), np.float32)
        feeds = {
            "input_ids": np.random.default_rng(0).integers(3, info.vocab_size, (1, args.width)),
            "attention_mask": np.ones((1, args.past + args.width), np.int64),
            "logits_rows": np.array([args.width - 1], np.int64),
            **{name: past for pair in info.kv_inputs for name in pair},
        }
        # logits_rows has a default (an initializer that is also an input): onnxruntime lists it among
        # the overridable initializers, not the inputs. Dropping it ran the head on every row.
        wanted = {i.name for i in (*session.get_inputs(), *session.get_overridable_initializers())}
        feeds = {k: v for k, v in feeds.items() if k in wanted}
        for _ in range(args.runs):
            started = time.perf_counter()
            session.run(["logits"], feeds)
            print(f"forward {(time.perf_counter() - started) * 1e3:.0f} ms")
        events = json.loads(Path(session.end_profiling()).read_text())
    per_op: collections.Counter[str] = collections.Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            per_op[event["args"]["op_name"]] += event["dur"]
    total = sum(per_op.values())
    for op, micros in per_op.most_common(10):
        print(f"{op:32s} {micros / args.runs / 1e3:8.1f} ms  {100 * micros / total:5.1f} %")


if __name__ == "__main__":
    main()
