"""Logits only for the rows that are read: device memory per prefill variant and prefill time per
chunk, this version against an earlier one (its head on every row), side by side in one run.

Usage (repo root; on the GPU host after `. .whl/gpu-env.sh`, or `--provider cpu` to check it here):
    python -m bench.gpu.logits --provider cuda --model 16x2048 --out $OUT [--baseline-root .bench-baseline]

Both versions load the same model directory, built with its head on every row
(`read_rows=False`): this version rewrites it into its cache and runs the head on
the last real row only, the baseline runs it as it is. Each runs in its own
process (`--worker`), prints one JSON line; the parent writes logits.json and logits.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
PROMPTS = (100, 1000, 3000)  # 1 chunk; 2 (the second padded 488 -> 512); 6 (the last 440 -> 512)


def build(name: str, root: Path) -> Path:
    from bench.gpu.run import SPECS
    from engine.modelgen.synthetic import TINY, build_synthetic

    spec = replace(TINY, rotary_rows=4096) if name == "tiny" else SPECS[name]
    return build_synthetic(replace(spec, read_rows=False), root, seed=0, chunk_size=512, context_length=4096)


def device_free(provider: str) -> int:
    if provider != "cuda":
        return 0
    import cupy as cp

    cp.cuda.Device().synchronize()
    return int(cp.cuda.runtime.memGetInfo()[0])


def measure(model: Path, provider: str, steps: int) -> dict[str, Any]:
    """Load, warm up (every variant prepared: captured on CUDA), then time prefills chunk by chunk."""
    from engine.executor import DecodeRow, EngineOptions
    from engine.executor.engine import Engine
    from engine.sampling import Sampler, SamplingParams

    free_start = device_free(provider)
    engine = Engine.load(model, EngineOptions(provider=provider, max_sessions=2, capacity=4096))
    free_loaded = device_free(provider)
    engine.warm_up()
    free_warm = device_free(provider)
    variants = [
        {"width": e.key.width, "batch": e.key.batch, "bytes": e.nbytes}
        for e in engine.stats().variants.entries
    ]
    vocab = engine.info.vocab_size
    rng = np.random.default_rng(0)
    greedy = Sampler(SamplingParams())
    chunks: dict[str, list[float]] = {}
    tokens: dict[str, list[int]] = {}
    for length in PROMPTS:
        ids = [int(t) for t in rng.integers(3, vocab, length)]
        for repeat in range(3):
            session = engine.open_session()
            start = time.perf_counter()
            for report in engine.prefill(session, ids):
                now = time.perf_counter()
                key = f"{report.forward.rows}@{report.width}"
                chunks.setdefault(key, []).append((now - start) * 1e3)
                start = now
            if repeat == 0:
                out = [engine.choose(session, greedy)]
                while len(out) < steps:
                    out.append(engine.decode([DecodeRow(session, out[-1], greedy)])[0])  # type: ignore[arg-type]
                tokens[str(length)] = out
            engine.close_session(session)
    return {
        "provider": engine.backend.name,
        "head_rows": "read" if getattr(engine.info, "logits_rows", None) else "every",
        "device_bytes": {
            "weights_and_pool": free_start - free_loaded,
            "variants_captured": free_loaded - free_warm,
        },
        "variants": variants,
        "prefill_ms_per_chunk": {k: float(np.median(v)) for k, v in chunks.items()},
        "greedy": tokens,
        "backend_memory": engine.backend.memory(),
        "memory": {"kv": engine.memory().kv, "variants": engine.memory().variants},
    }


def run_worker(args: argparse.Namespace, model: Path, root: Path | None) -> dict[str, Any]:
    from bench.cpu.run import module_from

    # From the baseline's root its engine/ comes first on sys.path; bench/ still comes from here.
    cmd = [
        sys.executable,
        *module_from(root, "bench.gpu.logits"),
        "--worker",
        str(model),
        "--provider",
        args.provider,
        "--steps",
        str(args.steps),
    ]
    done = subprocess.run(cmd, cwd=root or REPO, capture_output=True, text=True, check=False)
    (args.out / f"worker-{'baseline' if root else 'this'}.log").write_text(done.stderr)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-3:]}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def markdown(doc: dict[str, Any]) -> str:
    runs = {k: v for k, v in doc["runs"].items() if "error" not in v}
    lines = [
        f"# Logits for the rows read, {doc['provider']}, model {doc['model']}",
        "",
        f"- command: `{doc['command']}`",
        "",
    ]
    lines += [
        "| version | head on | prefill variant bytes (width: MB) | captured by warm-up MB |",
        "| --- | --- | --- | --- |",
    ]
    for name, run in runs.items():
        prefill = ", ".join(
            f"{v['width']}: {v['bytes'] / 2**20:.1f}" for v in run["variants"] if not v["batch"]
        )
        lines.append(
            f"| {name} | {run['head_rows']} rows | {prefill} | "
            f"{run['device_bytes']['variants_captured'] / 2**20:.1f} |"
        )
    keys = sorted(
        {k for run in runs.values() for k in run["prefill_ms_per_chunk"]},
        key=lambda k: tuple(int(x) for x in k.split("@")),
    )
    lines += [
        "",
        "| chunk (real rows @ width) | " + " | ".join(f"{n} ms" for n in runs) + " |",
        "|" + " --- |" * (len(runs) + 1),
    ]
    for key in keys:
        cells = [f"{run['prefill_ms_per_chunk'].get(key, float('nan')):.2f}" for run in runs.values()]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    same = len({json.dumps(run["greedy"], sort_keys=True) for run in runs.values()}) == 1
    lines += ["", f"- greedy tokens after prompts of {list(PROMPTS)} identical across versions: {same}"]
    for name, run in doc["runs"].items():
        if "error" in run:
            lines.append(f"- {name}: error {run['error']}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--provider", default="cuda")
    parser.add_argument("--model", default="16x2048", help="16x2048, 8x1024 or tiny")
    parser.add_argument("--root", type=Path, default=Path("/tmp/ladder-gpu-models"))
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--baseline-root", type=Path, default=None)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        print(json.dumps(measure(args.worker, args.provider, args.steps)))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    model = build(args.model, args.root)
    runs = {"this": run_worker(args, model, None)}
    if args.baseline_root is not None:
        runs["baseline"] = run_worker(args, model, args.baseline_root.resolve())
    doc = {
        "provider": args.provider,
        "model": args.model,
        "model_dir": str(model),
        "command": "python -m bench.gpu.logits " + " ".join(sys.argv[1:]),
        "runs": runs,
    }
    (args.out / "logits.json").write_text(json.dumps(doc, indent=1) + "\n")
    (args.out / "logits.md").write_text(markdown(doc))
    print(markdown(doc))


if __name__ == "__main__":
    main()
