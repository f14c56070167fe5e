"""GPU benchmark: Ladder's CUDA-graph variants vs onnxruntime-genai-cuda, side by side, one run.

Usage (on the GPU host, after `. .whl/gpu-env.sh`, from the repo root):
    python3 -m bench.gpu.run --out $OUT [--models 8x1024,16x2048]

Builds the random fp16 GQA decoders (vocab 32000, capacity 8192, chunk 512),
measures the device's copy bandwidth, then runs each worker of
bench/gpu/workers.py in its own process and writes gpu-results.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from engine.modelgen.builder import DecoderSpec
from engine.modelgen.synthetic import build_synthetic

REPO = Path(__file__).resolve().parents[2]
BASE = DecoderSpec(
    vocab_size=32000,
    hidden_size=1024,
    intermediate_size=2816,
    num_layers=8,
    num_heads=16,
    num_kv_heads=4,
    head_size=64,
    rotary_rows=8192,
    dtype="float16",
    read_rows=False,
)  # onnxruntime-genai-cuda runs these too: no read-rows gather
SPECS = {
    "8x1024": BASE,
    "16x2048": replace(
        BASE,
        hidden_size=2048,
        intermediate_size=5632,
        num_layers=16,
        num_heads=16,
        num_kv_heads=4,
        head_size=128,
    ),
    # A 3B-class decoder (Llama-3.2-3B's shape, 32000 vocab): where a prefill forward's cost grows
    # with its rows, unlike the two above, whose forwards are bound by kernel latency on an H200.
    "28x3072": replace(
        BASE,
        hidden_size=3072,
        intermediate_size=8192,
        num_layers=28,
        num_heads=24,
        num_kv_heads=8,
        head_size=128,
    ),
    # An 8B-class decoder (Llama-3.1-8B's shape and vocabulary): 15 GiB of fp16 weights, where
    # decode is bound by memory bandwidth. Its layers repeat the first one's weights (drawn in
    # seconds, not minutes; every layer still reads its own bytes).
    "8b": replace(
        BASE,
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        head_size=128,
    ),
}
REPEATED_LAYERS = {"8b"}
FLAGS = {
    "packed": {"packed_projections": True},  # q|k|v and gate|up as one MatMul each
    "int4": {"int4_block": 32},  # layer matrices as MatMulNBits, as the builder writes for CUDA
    "fused": {"fused_norms": True},
}  # residual Add + norm as SkipSimplifiedLayerNormalization
H200_BANDWIDTH = 4.8e12  # bytes/s, the H200's HBM3e as NVIDIA states it


def spec_of(name: str) -> DecoderSpec:
    """A SPECS key, then any of `-packed`, `-int4`, `-fused` (FLAGS): "8b", "8b-int4", "8b-packed-fused"."""
    base, *flags = name.split("-")
    spec = SPECS[base]
    for flag in flags:
        spec = replace(spec, **FLAGS[flag])  # type: ignore[arg-type]
    return spec


def weight_bytes_per_token(spec: DecoderSpec) -> int:
    """Bytes of weights a decode step reads: every matrix and norm, the lm head, one embedding row
    (fp16; int4 layer matrices: half a byte a weight and a 2-byte scale per block)."""
    h, q, kv = spec.hidden_size, spec.num_heads * spec.head_size, spec.num_kv_heads * spec.head_size
    matrices = h * q + 2 * h * kv + q * h + 3 * h * spec.intermediate_size
    per_weight = 0.5 + 2 / spec.int4_block if spec.int4_block else 2
    layer = matrices * per_weight + 2 * 2 * h
    return int(spec.num_layers * layer + 2 * (h + h * spec.vocab_size + h))


def kv_bytes_per_row(spec: DecoderSpec, past: int) -> int:
    """Bytes of keys and values one row's decode step reads over `past` positions (fp16)."""
    return 2 * spec.num_layers * spec.num_kv_heads * spec.head_size * past * 2


def decode_floors(spec: DecoderSpec, batches: list[int], past: int, bandwidth: float) -> dict[str, Any]:
    """The memory-bandwidth floor of one decode step of B rows at `past`: the weights once and every
    row's KV, read at `bandwidth` bytes/s. A step cannot take less; tok/s cannot be more."""
    weights = weight_bytes_per_token(spec)
    out: dict[str, Any] = {"bandwidth_bytes_s": bandwidth, "weight_bytes": weights, "past": past}
    for b in batches:
        step_bytes = weights + b * kv_bytes_per_row(spec, past)
        ms = step_bytes / bandwidth * 1e3
        out[str(b)] = {"step_bytes": step_bytes, "floor_ms": ms, "ceiling_tok_s": b * 1e3 / ms}
    return out


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read and written."""
    import cupy as cp

    src = cp.ones(2**31, cp.uint8)
    dst = cp.empty_like(src)
    dst[...] = src
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(10):
        dst[...] = src
    stop.record()
    stop.synchronize()
    seconds = cp.cuda.get_elapsed_time(start, stop) / 1e3
    return 2 * src.nbytes * 10 / seconds


def build(name: str, root: Path) -> Path:
    """The model directory, with CUDA graphs switched on for onnxruntime-genai (Ladder ignores it)."""
    path = build_synthetic(
        spec_of(name),
        root,
        seed=0,
        chunk_size=512,
        context_length=8192,
        repeat_layers=name.split("-")[0] in REPEATED_LAYERS,
    )
    config_path = path / "genai_config.json"
    config = json.loads(config_path.read_text())
    config["model"]["decoder"]["session_options"]["provider_options"] = [{"cuda": {"enable_cuda_graph": "1"}}]
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    return path


def worker(args: list[str], log: Path, timeout: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.gpu.workers", *args]
    t0 = time.perf_counter()
    with log.open("a") as err:
        err.write(f"\n== {' '.join(cmd)}\n")
        err.flush()
        try:
            # Workers inherit PYTHONPATH (device.sh puts the repo on it).
            done = subprocess.run(
                cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"error": f"exit {done.returncode}; see log"}
    result = dict(json.loads(lines[-1]))
    result["wall_s"] = time.perf_counter() - t0
    return result


def agreement(a: list[int], b: list[int]) -> dict[str, int]:
    prefix = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return {
        "common_prefix": prefix,
        "equal": sum(x == y for x, y in zip(a, b, strict=False)),
        "compared": min(len(a), len(b)),
    }


def summarize(name: str, runs: dict[str, Any], bandwidth: float) -> dict[str, Any]:
    ladder, genai = runs.get("ladder", {}), runs.get("genai", {})
    out: dict[str, Any] = {"weight_bytes_per_token": weight_bytes_per_token(spec_of(name))}
    out["floor_tok_s"] = decode_floors(spec_of(name), [1], 0, bandwidth)["1"]["ceiling_tok_s"]  # weights only
    if "first" in ladder and "first" in genai:
        for name in ("ttft_pass2", "ttft_fresh"):
            out[f"{name}_median_ms"] = {
                "ladder": ladder[name]["median_ms"],
                "genai": genai[name]["median_ms"],
            }
        for phase in ("first", "steady"):
            ours, theirs = ladder[phase]["decode_tok_s"], genai[phase]["decode_tok_s"]
            out[f"{phase}_decode_ratio"] = ours / theirs if theirs else None
            out[f"{phase}_decode_pct_of_floor"] = 100 * ours / out["floor_tok_s"]
        out["greedy_agreement_1137"] = agreement(ladder["first"]["tokens"], genai["first"]["tokens"])
        pairs = zip(ladder["first_tokens_12"].values(), genai["first_tokens_12"].values(), strict=True)
        out["greedy_agreement_12_prompts"] = [agreement(a, b) for a, b in pairs]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", default="8x1024,16x2048")
    parser.add_argument("--root", type=Path, default=Path("/tmp/ladder-models"))
    parser.add_argument("--timeout", type=int, default=240)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log, results_path = args.out / "gpu-bench.log", args.out / "gpu-results.json"
    results: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(sys.argv),
        "models": {},
    }
    results["copy_bandwidth_bytes_s"] = bandwidth = copy_bandwidth()
    for index, name in enumerate(args.models.split(",")):
        t0 = time.perf_counter()
        path = build(name, args.root)
        entry: dict[str, Any] = {"spec": asdict(SPECS[name]), "build_s": time.perf_counter() - t0}
        results["models"][name] = entry
        cold = [("cold_ladder", ["cold", "x", "ladder"]), ("cold_genai", ["cold", "x", "genai"])]
        order = cold if index % 2 == 0 else cold[::-1]
        for key, worker_args in (
            *order,
            ("ladder", ["ladder"]),
            ("genai", ["genai"]),
            ("seed_padding_on", ["seed", "x", "on"]),
            ("seed_padding_off", ["seed", "x", "off"]),
        ):
            worker_args = [worker_args[0], str(path), *worker_args[2:]]
            entry[key] = worker(worker_args, log, args.timeout)
            print(name, key, json.dumps(entry[key])[:400], flush=True)
            results_path.write_text(json.dumps(results, indent=1))
        entry["summary"] = summarize(name, entry, bandwidth)
        print(name, "summary", json.dumps(entry["summary"]), flush=True)
        results_path.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
