"""CPU benchmark of the default model: Ladder vs onnxruntime-genai vs llama.cpp, side by side.

Usage (from the repo root):
    .venv/bin/python -m bench.cpu.run [--cache-root DIR] [--llama-python /tmp/llamavenv/bin/python]
        [--baseline-root DIR --baseline-cache-root DIR] [--skip fp32,genai,llamacpp,unchunked]

Each runtime runs in its own process on the same token ids: Ladder and
onnxruntime-genai on the same converted directory (fp32, and the opt-in int4
one), llama.cpp on the GGUF itself. With --baseline-root (an earlier Ladder:
`git archive <rev> engine service proto` unpacked there) that version runs
beside this one, on directories its own converter made under
--baseline-cache-root. Results go to <out>/cpu-<date>.md and .json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.default_model import prepare
from engine.tokenizer import Tokenizer
from service.config import load_config

REPO = Path(__file__).resolve().parents[2]
LENGTHS = [100, 1000, 4000]


def prompt_ids(tokenizer: Tokenizer, count: int) -> list[int]:
    """`count` ids of real text: the repo's own Python sources, in sorted order, repeated."""
    text = "\n".join(p.read_text() for p in sorted((REPO / "engine").rglob("*.py")))
    ids = tokenizer.encode(text)
    return (ids * (count // len(ids) + 1))[:count]


def worker(python: str, args: list[str], root: Path | None = None) -> dict[str, Any]:
    """One runtime in its own process; with `root`, Ladder's packages come from there (a baseline)."""
    # Raised priority: other work on this shared 2-core box otherwise dominates the numbers.
    cmd = ["nice", "-n", "-10", python, *module_from(root, "bench.cpu.runtimes"), *args]
    print("running:", " ".join(cmd), f"(in {root})" if root else "", file=sys.stderr, flush=True)
    done = subprocess.run(cmd, cwd=root or REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:] or ["exit"]}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def module_from(root: Path | None, module: str) -> list[str]:
    """Arguments that run `module` of this repo with Ladder's packages from `root` (None: this repo).

    Python puts its working directory first on sys.path: the baseline's engine/ wins there,
    and this repo comes second, for bench/ alone."""
    if root is None:
        return ["-m", module]
    return [
        "-c",
        f"import runpy, sys; sys.path.insert(1, {str(REPO)!r}); "
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)",
    ]


def machine() -> dict[str, Any]:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "mem_gb": round(mem_kb / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }


def versions(llama_python: str | None) -> dict[str, str]:
    from importlib.metadata import version

    found = {p: version(p) for p in ("onnxruntime", "onnxruntime-genai", "onnxruntime-extensions")}
    if llama_python:
        out = subprocess.run(
            [llama_python, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
            capture_output=True,
            text=True,
            check=False,
        )
        found["llama-cpp-python"] = out.stdout.strip() or "unavailable"
    return found


def git_commit() -> str:
    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
    )
    return out.stdout.strip()


@dataclass(frozen=True)
class Baseline:
    root: Path  # an earlier Ladder's engine/ service/ proto/
    fp32: Path  # ... and the directories its own converter made
    int4: Path


def prepare_baseline(root: Path, cache_root: Path, gguf: Path) -> Baseline:
    """The baseline's converted directories, made by its own converter (its GGUF copied in)."""
    downloads = cache_root / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    if not (downloads / gguf.name).exists():
        shutil.copy(gguf, downloads / gguf.name)
    dirs = []
    for precision in ("fp32", "int4"):
        cmd = [
            sys.executable,
            "-m",
            "engine.default_model",
            "--cache-root",
            str(cache_root),
            "--precision",
            precision,
        ]
        done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=True)
        dirs.append(Path(done.stdout.strip().splitlines()[-1]))
    return Baseline(root, *dirs)


def run_all(
    model_dir: Path,
    int4_dir: Path,
    gguf: Path,
    ids_file: Path,
    llama_python: str | None,
    baseline: Baseline | None = None,
    skip: frozenset[str] = frozenset(),
) -> dict[str, dict[str, Any]]:
    common = [str(model_dir), str(gguf), str(ids_file), "--lengths", *map(str, LENGTHS)]
    int4 = [str(int4_dir), *common[1:]]
    results: dict[str, dict[str, Any]] = {}
    for name, args, before in (
        ("fp32", common, baseline and baseline.fp32),
        ("int4", int4, baseline and baseline.int4),
    ):
        if name in skip:
            continue
        results[f"ladder {name}"] = worker(sys.executable, ["ladder", *args])
        if baseline is not None and before:
            results[f"ladder {name} (baseline)"] = worker(
                sys.executable, ["ladder", str(before), *args[1:]], baseline.root
            )
        if "genai" not in skip:
            results[f"onnxruntime-genai {name}"] = worker(sys.executable, ["genai", *args])
    if llama_python and "llamacpp" not in skip:
        results["llama.cpp"] = worker(llama_python, ["llamacpp", *common])
    rss_only = [str(gguf), str(ids_file), "--lengths", "4000", "--new-tokens", "0", "--repeats", "2"]
    rss_runs = [
        ("int4 4000 chunked@512", int4_dir, None, ["--chunk-size", "512"]),
        ("fp32 4000 chunked@512", model_dir, None, ["--chunk-size", "512"]),
    ]
    rss_runs = [run for run in rss_runs if "fp32" not in skip or "fp32" not in run[0]]
    if baseline is not None:
        rss_runs.insert(
            1, ("int4 4000 chunked@512 (baseline)", baseline.int4, baseline.root, ["--chunk-size", "512"])
        )
    if "unchunked" not in skip and "fp32" not in skip:
        rss_runs.append(("fp32 4000 unchunked", model_dir, None, ["--chunk-size", "0", "--no-padding"]))
    for name, path, root, extra in rss_runs:
        results[f"ladder {name}"] = worker(sys.executable, ["ladder", str(path), *rss_only, *extra], root)
    return results


def _baseline_rev(root: Path) -> str:
    rev = root / "REV"  # written beside the archive by whoever unpacked it
    return rev.read_text().strip() if rev.exists() else "unknown"


def _cell(result: dict[str, Any], key: str, fmt: str) -> str:
    value = result
    for part in key.split("."):
        value = value.get(part, {}) if isinstance(value, dict) else {}
    return format(value, fmt) if isinstance(value, int | float) else "–"


def markdown(doc: dict[str, Any]) -> str:
    head = [
        "runtime",
        "load s",
        *[f"TTFT {n} s" for n in LENGTHS],
        "prefill tok/s @1000",
        "decode tok/s (128 after 1000)",
        "peak RSS MB",
    ]
    lines = [
        f"# CPU benchmark, {doc['date']}",
        "",
        f"- machine: {doc['machine']}",
        f"- versions: {doc['versions']}",
        f"- model: {doc['model']}",
        f"- commit: {doc['commit']}",
        f"- command: `{doc['command']}`",
        *([f"- baseline: {doc['baseline']}"] if doc.get("baseline") else []),
        f"- load average before/after: {doc['loadavg_before']} / {doc['loadavg_after']}",
        "- TTFT: best of 3 (of 2 at 4000 tokens), after one warm-up; decode: 1 / median "
        "step; workers run at nice -10 in their own process, one after another",
        "",
        "| " + " | ".join(head) + " |",
        "|" + " --- |" * len(head),
    ]
    for name, r in doc["results"].items():
        if "error" in r:
            lines.append(f"| {name} | error: {r['error']} |")
            continue
        ttft_1000 = r["ttft_s"].get("1000")
        rate = f"{1000 / ttft_1000:.0f}" if ttft_1000 else "–"
        cells = [
            name,
            _cell(r, "load_s", ".1f"),
            *[_cell(r, f"ttft_s.{n}", ".2f") for n in LENGTHS],
            rate,
            _cell(r, "decode_tok_s", ".1f"),
            _cell(r, "peak_rss_mb", ".0f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cache-root", type=Path, default=Path(load_config(argv=[]).model_cache))
    parser.add_argument("--llama-python", help="a python with llama-cpp-python installed")
    parser.add_argument("--out", type=Path, help="default: bench/results/cpu-<date>, one folder per result")
    parser.add_argument("--baseline-root", type=Path, help="an earlier Ladder to run side by side")
    parser.add_argument("--baseline-cache-root", type=Path, default=Path("/tmp/ladder-baseline-cache"))
    parser.add_argument("--skip", default="", help="comma-separated: fp32, genai, llamacpp, unchunked")
    args = parser.parse_args()
    today = dt.date.today().isoformat()
    # Resolved: a baseline's workers run from another directory.
    args.out = (args.out or REPO / "bench" / "results" / f"cpu-{today}").resolve()
    prepared = prepare(args.cache_root)
    int4_dir = prepare(args.cache_root, precision="int4").model_dir
    baseline = None
    if args.baseline_root:
        baseline = prepare_baseline(args.baseline_root, args.baseline_cache_root, prepared.gguf_path)
    ids = prompt_ids(Tokenizer(prepared.model_dir), max(LENGTHS))
    ids_file = args.out / "prompt-ids.tmp.json"
    args.out.mkdir(parents=True, exist_ok=True)
    ids_file.write_text(json.dumps(ids))
    before = os.getloadavg()
    results = run_all(
        prepared.model_dir,
        int4_dir,
        prepared.gguf_path,
        ids_file,
        args.llama_python,
        baseline,
        frozenset(filter(None, args.skip.split(","))),
    )
    ids_file.unlink()
    doc = {
        "date": today,
        "machine": machine(),
        "versions": versions(args.llama_python),
        "model": prepared.model_dir.name,
        "commit": git_commit(),
        "prompt_ids_sha256": hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16],
        "command": "python -m bench.cpu.run " + " ".join(sys.argv[1:]),
        "loadavg_before": [round(x, 2) for x in before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "results": results,
        "baseline": None
        if baseline is None
        else {"root": str(baseline.root), "rev": _baseline_rev(baseline.root)},
    }
    (args.out / f"cpu-{today}.json").write_text(json.dumps(doc, indent=1) + "\n")
    (args.out / f"cpu-{today}.md").write_text(markdown(doc))
    print(markdown(doc))


if __name__ == "__main__":
    main()
