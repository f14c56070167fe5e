"""Where an 8B-class decode step's time goes on the device, against the bytes it must read.

Two measurements, one process:
- `gemv`: cuBLAS alone (cupy.matmul, as onnxruntime's MatMul calls it) on each of the layer's
  matrices at 1 and 64 rows, weights [in, out] as our graphs store them and [out, in] transposed,
  rotating over enough copies that no matrix stays in the 50 MB L2. The best a step built of these
  GEMMs can do, matrix by matrix, in time and bytes/s.
- `layers`: onnxruntime's raw graph replay (bench/batching.raw_replay) of decoders of one model name
  (bench/gpu/run.py: `8b`, `-packed`, `-fused`, `-int4`) built with two layer counts: the slope is
  what a layer costs, the intercept what the embedding, final norm and 128k head cost; a 32-layer
  step = intercept + 32 slopes, checked by the full model's run (bench/gpu/floors.sh).

    python3 -m bench.gpu.decode_anatomy --models 8b,8b-packed-fused --layers 2,6 --out $OUT
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.batching import raw_replay
from bench.gpu.run import H200_BANDWIDTH, SPECS, spec_of, weight_bytes_per_token
from engine.modelgen.synthetic import build_synthetic

L2_BYTES = 50 * 2**20


def layer_matrices(name: str) -> dict[str, tuple[int, int]]:
    """The [in, out] matrices of one layer of SPECS[name], with the packed ones and the head."""
    s = SPECS[name]
    h, q, kv, m = s.hidden_size, s.num_heads * s.head_size, s.num_kv_heads * s.head_size, s.intermediate_size
    return {
        "q": (h, q),
        "k": (h, kv),
        "v": (h, kv),
        "qkv": (h, q + 2 * kv),
        "o": (q, h),
        "gate": (h, m),
        "up": (h, m),
        "gate_up": (h, 2 * m),
        "down": (m, h),
        "head": (h, s.vocab_size),
    }


def gemv(shapes: dict[str, tuple[int, int]], rows: list[int], repeats: int = 100) -> dict[str, Any]:
    """cuBLAS time of x[rows, in] @ W for each shape, both weight layouts, median-free mean of
    `repeats` calls over rotating copies (timed with device events)."""
    import cupy as cp

    out: dict[str, Any] = {}
    for label, (k, n) in shapes.items():
        copies = max(2, -(-4 * L2_BYTES // (k * n * 2)))
        stored = [
            cp.random.standard_normal((k, n), dtype=cp.float32).astype(cp.float16) for _ in range(copies)
        ]
        layouts = {"in_out": stored, "out_in": [cp.ascontiguousarray(w.T) for w in stored]}
        for b in rows:
            x = cp.random.standard_normal((b, k), dtype=cp.float32).astype(cp.float16)
            for layout, weights in layouts.items():
                views = weights if layout == "in_out" else [w.T for w in weights]
                for w in views[:2]:
                    cp.matmul(x, w)
                start, stop = cp.cuda.Event(), cp.cuda.Event()
                start.record()
                for i in range(repeats):
                    cp.matmul(x, views[i % copies])
                stop.record()
                stop.synchronize()
                us = cp.cuda.get_elapsed_time(start, stop) * 1e3 / repeats
                out[f"{label}/{layout}/{b}"] = {"us": us, "weight_gb_s": k * n * 2 / us / 1e3}
        del stored, layouts
        cp.get_default_memory_pool().free_all_blocks()
    return out


def per_layer(
    name: str, layer_counts: list[int], batches: list[int], root: Path, capacity: int, past: int
) -> dict[str, Any]:
    """Raw replay step time at each layer count; slope (per layer) and intercept, per batch."""
    runs: dict[str, Any] = {}
    for count in layer_counts:
        t0 = time.perf_counter()
        spec = replace(spec_of(name), num_layers=count)
        path = build_synthetic(
            spec, root, seed=0, chunk_size=512, context_length=capacity, repeat_layers=True
        )
        built = time.perf_counter() - t0
        runs[str(count)] = {"build_s": built, "replay": raw_replay(path, batches, capacity, past)}
        shutil.rmtree(path)
        print(name, count, json.dumps(runs[str(count)]), flush=True)
    lo, hi = min(layer_counts), max(layer_counts)
    spec = spec_of(name)
    layer_bytes = weight_bytes_per_token(replace(spec, num_layers=2)) - weight_bytes_per_token(
        replace(spec, num_layers=1)
    )
    fits: dict[str, Any] = {}
    for b in map(str, batches):
        t_lo, t_hi = runs[str(lo)]["replay"][b]["step_ms"], runs[str(hi)]["replay"][b]["step_ms"]
        slope = (t_hi - t_lo) / (hi - lo)
        intercept = t_lo - lo * slope
        full = intercept + spec.num_layers * slope
        fits[b] = {
            "ms_per_layer": slope,
            "intercept_ms": intercept,
            f"projected_{spec.num_layers}_ms": full,
            "layer_weight_gb_s": layer_bytes / slope / 1e6 if slope > 0 else None,
        }
    return {
        "runs": runs,
        "fits": fits,
        "layer_weight_bytes": layer_bytes,
        "floor_b1_ms": weight_bytes_per_token(spec) / H200_BANDWIDTH * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="8b,8b-packed-fused,8b-int4,8b-packed-fused-int4")
    parser.add_argument("--layers", default="2,6")
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--past", type=int, default=512)
    parser.add_argument("--capacity", type=int, default=1024)
    parser.add_argument("--root", type=Path, default=Path("/tmp/ladder-anatomy"))
    parser.add_argument("--skip-gemv", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in args.batches.split(",")]
    result: dict[str, Any] = {"command": " ".join(["python3 -m bench.gpu.decode_anatomy", *vars_of(args)])}
    target = args.out / "decode-anatomy.json"
    if not args.skip_gemv:
        result["gemv"] = gemv(layer_matrices("8b"), batches)
        for key, row in result["gemv"].items():
            print(key, json.dumps(row), flush=True)
        target.write_text(json.dumps(result, indent=1) + "\n")
    result["models"] = {}
    for name in args.models.split(","):
        result["models"][name] = per_layer(
            name, [int(n) for n in args.layers.split(",")], batches, args.root, args.capacity, args.past
        )
        print(name, "fits", json.dumps(result["models"][name]["fits"]), flush=True)
        target.write_text(json.dumps(result, indent=1) + "\n")


def vars_of(args: argparse.Namespace) -> list[str]:
    return [f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"]


if __name__ == "__main__":
    main()
