"""Before/after on a busy box: this Ladder and an earlier one, alternated, best of many.

Usage (from the repo root):
    .venv/bin/python -m bench.cpu.logits --cache-root DIR --baseline-root DIR --baseline-cache-root DIR
        [--rounds 3] [--lengths 1000] [--out DIR]

On a shared 2-core machine the load changes from one minute to the next, so a
single run of each version says little. Here the two versions' workers
(bench/cpu/runtimes.py, each its own process at nice -10) alternate round
after round on the same prompt ids; the fastest TTFT each version reached over
all rounds is the least disturbed one, and the peak RSS of every run is kept.

`--in-process` times prefills closer together: one process loads this
version's directory (head on the read row) and the baseline's directory with
`graph_read_only` (its head on every row, as the baseline runs it) and
alternates their prefills, prompt by prompt, so both see the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from bench.cpu.run import Baseline, prepare_baseline, prompt_ids, worker
from engine.default_model import prepare
from engine.tokenizer import Tokenizer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cache-root", type=Path, required=True)
    parser.add_argument("--baseline-root", type=Path, required=True)
    parser.add_argument("--baseline-cache-root", type=Path, required=True)
    parser.add_argument("--precisions", default="int4,fp32")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--in-process", action="store_true")
    args = parser.parse_args()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    prepared = prepare(args.cache_root)
    baseline = prepare_baseline(args.baseline_root.resolve(), args.baseline_cache_root, prepared.gguf_path)
    if args.in_process:
        in_process(args, prepared.model_dir, baseline)
        return
    ids_file = args.out / "prompt-ids.tmp.json"
    ids_file.write_text(json.dumps(prompt_ids(Tokenizer(prepared.model_dir), max(args.lengths))))
    dirs = {
        "this": {p: prepare(args.cache_root, precision=p).model_dir for p in ("fp32", "int4")},
        "baseline": {"fp32": baseline.fp32, "int4": baseline.int4},
    }
    runs: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        for precision in args.precisions.split(","):
            for version in ("this", "baseline"):
                cmd = [
                    "ladder",
                    str(dirs[version][precision]),
                    str(prepared.gguf_path),
                    str(ids_file),
                    "--lengths",
                    *map(str, args.lengths),
                    "--new-tokens",
                    "0",
                    "--repeats",
                    str(args.repeats),
                    "--chunk-size",
                    "512",
                ]
                result = worker(sys.executable, cmd, baseline.root if version == "baseline" else None)
                runs.append(
                    {
                        "round": round_,
                        "version": version,
                        "precision": precision,
                        "loadavg": os.getloadavg()[0],
                        **result,
                    }
                )
    ids_file.unlink()
    summary = summarize(runs, args.lengths)
    doc = {
        "command": "python -m bench.cpu.logits " + " ".join(sys.argv[1:]),
        "baseline_root": str(args.baseline_root),
        "summary": summary,
        "runs": runs,
    }
    (args.out / "ab.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


def in_process(args: argparse.Namespace, model_dir: Path, baseline: Baseline) -> None:
    import time

    import numpy as np

    from engine.executor import EngineOptions
    from engine.executor.engine import Engine

    ids = prompt_ids(Tokenizer(model_dir), max(args.lengths))
    out: dict[str, Any] = {}
    for precision in args.precisions.split(","):
        this = prepare(args.cache_root, precision=precision).model_dir
        before = baseline.fp32 if precision == "fp32" else baseline.int4
        engines = {
            "read row": Engine.load(this, EngineOptions(max_sessions=1, chunk_size=512)),
            "every row": Engine.load(
                before, EngineOptions(max_sessions=1, chunk_size=512, graph_read_only=True)
            ),
        }
        times: dict[str, dict[int, list[float]]] = {k: {n: [] for n in args.lengths} for k in engines}
        tokens: dict[str, dict[str, int]] = {}  # prompt length -> engine -> first greedy token
        for _ in range(args.rounds):
            for n in args.lengths:
                for name, engine in engines.items():
                    session = engine.open_session()
                    start = time.perf_counter()
                    logits = engine.append(session, ids[:n])
                    times[name][n].append(time.perf_counter() - start)
                    tokens.setdefault(str(n), {})[name] = int(np.argmax(logits))
                    engine.close_session(session)
        out[precision] = {
            name: {str(n): {"best_s": min(t), "median_s": float(np.median(t))} for n, t in per.items()}
            for name, per in times.items()
        }
        out[precision]["first_token"] = tokens
        out[precision]["same_first_token"] = all(len(set(t.values())) == 1 for t in tokens.values())
        del engines
    doc = {
        "command": "python -m bench.cpu.logits " + " ".join(sys.argv[1:]),
        "loadavg": os.getloadavg(),
        "prefill": out,
    }
    (args.out / "in-process.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))


def summarize(runs: list[dict[str, Any]], lengths: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for run in runs:
        if "error" in run:
            continue
        entry = out.setdefault(
            f"{run['precision']} {run['version']}", {"best_ttft_s": {}, "peak_rss_mb": 0.0, "runs": 0}
        )
        entry["runs"] += 1
        entry["peak_rss_mb"] = max(entry["peak_rss_mb"], run["peak_rss_mb"])
        for n in map(str, lengths):
            best = entry["best_ttft_s"].get(n, float("inf"))
            entry["best_ttft_s"][n] = min(best, run["ttft_s"][n])
    return out


if __name__ == "__main__":
    main()
