"""Real-world JSON Schemas handled correctly (issue #41): each schema of JSON Schema Store that has
test instances, compiled as a `json_schema` constraint on the default model's vocabulary (its first
mask computed, as the server does before a request runs), then every valid instance (src/test) and
every invalid one (src/negative_test) walked through it as `json.dumps` writes it (its own member
order: objects take their members in any order; bench/instance_walk.py). A schema is handled
correctly when it compiles, every valid instance is admitted and every invalid one refused.
`git archive` may stop at a blob the snapshot lacks; extracting file by file (`git cat-file
--batch`) skips those.

    git -C <schemastore> archive HEAD src/schemas/json src/test src/negative_test | tar -x -C /tmp/ss
    python -m bench.schema_instances /tmp/ss/src --out bench/results/<dir>/instances.json

`--maskbench DIR` reads JSONSchemaBench's MaskBench instead (guidance-ai/jsonschemabench,
`maskbench/data/*.json`: a schema and its `tests`, each `{"data", "valid"}`; ~11k schemas from
GitHub, Kubernetes, Snowplow, Schema Store, function calls, API specs); schemas without tests
count as handled when they compile, and each instance is walked as MaskBench writes it
(`json.dumps(data, ensure_ascii=False)`: its own member order, one space after `:` and `,`),
MaskBench's own reading. Work spreads over `--jobs` processes.

Prints the summary: shares, valid instances refused, invalid ones admitted (each a finding: a
bug, or where the engine's output policy cannot write a valid instance), compile + first mask
CPU time p50/p99/max.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.instance_walk import admits, admits_as_written
from engine.constrain import Vocabulary, compile_constraint
from engine.constrain.budget import Budget
from engine.errors import InvalidInput

MAX_SCHEMA_BYTES = 64 * 1024
DEFAULT_MODEL = Path(".pytest_cache/d/ladder-default-model/models/smollm2-135m-instruct-int4-ctx4096")


def vocabulary(model_dir: Path) -> Vocabulary:
    from engine.tokenizer import Tokenizer

    tokenizer = Tokenizer(model_dir)
    config = json.loads((model_dir / "genai_config.json").read_text())["model"]
    eos = config["eos_token_id"]
    return Vocabulary.from_tokenizer(tokenizer, config["vocab_size"], eos if isinstance(eos, list) else [eos])


def instances(root: Path, kind: str, name: str) -> list[Any]:
    found = []
    for path in sorted((root / kind / name).glob("*.json")):
        try:
            found.append(json.loads(path.read_text(encoding="utf-8")))
        except (ValueError, UnicodeDecodeError):
            continue
    return found


def check(
    text: str,
    valid: list[Any],
    invalid: list[Any],
    vocab: Vocabulary,
    seconds: float,
    as_written: bool = False,
) -> dict[str, Any]:
    budget = Budget(seconds)
    budget.start()
    started = time.thread_time()
    try:
        compiled = compile_constraint("json_schema", text, vocab, budget=budget)
        compiled.start().allowed()
    except InvalidInput as exc:
        found = re.search(r"'([^']+)'", str(exc))
        return {
            "compiled": False,
            "reason": exc.reason,
            "keyword": found.group(1) if found else "",
            "cpu_s": round(time.thread_time() - started, 4),
        }
    result: dict[str, Any] = {
        "compiled": True,
        "engine": type(compiled).__name__,
        "cpu_s": round(time.thread_time() - started, 4),
    }
    walk = admits_as_written if as_written else admits
    try:
        walked_valid = [walk(compiled, v) for v in valid]
        walked_invalid = [walk(compiled, v) for v in invalid]
    except InvalidInput as exc:  # mid-walk, as a row would be (CONSTRAINT_TOO_LARGE: parses)
        result.update(walk_error=exc.reason, valid_refused=[], invalid_admitted=[], undecided=1)
        return {**result, "handled": False}
    if as_written:  # a valid instance refused as written: does another order of its members fit?
        result["valid_in_another_order"] = [
            i for i, ok in enumerate(walked_valid) if not ok and admits(compiled, valid[i], 2_000)
        ]
    result["valid_refused"] = [i for i, ok in enumerate(walked_valid) if ok is False]
    result["invalid_admitted"] = [i for i, ok in enumerate(walked_invalid) if ok is True]
    result["undecided"] = sum(ok is None for ok in walked_valid + walked_invalid)
    result["handled"] = not (result["valid_refused"] or result["invalid_admitted"] or result["undecided"])
    return result


def split_of(name: str) -> str:
    """MaskBench's split of a file name: `Github_easy---o1.json` is Github_easy, `BFCL_java_3` BFCL_java."""
    stem = name.removesuffix(".json")
    return stem.split("---")[0] if "---" in stem else stem.rsplit("_", 1)[0]


_VOCAB: list[Vocabulary] = []


def _maskbench_one(job: tuple[str, Path, float]) -> tuple[str, dict[str, Any]]:
    name, model_dir, seconds = job
    if not _VOCAB:
        _VOCAB.append(vocabulary(model_dir))
    started = time.perf_counter()
    case = json.loads(Path(name).read_text(encoding="utf-8"))
    tests = case.get("tests", [])
    valid = [t["data"] for t in tests if t["valid"]]
    invalid = [t["data"] for t in tests if not t["valid"]]
    result = check(json.dumps(case["schema"]), valid, invalid, _VOCAB[0], seconds, as_written=True)
    result.update(
        valid=len(valid),
        invalid=len(invalid),
        split=split_of(Path(name).name),
        wall_s=round(time.perf_counter() - started, 3),
    )
    return Path(name).name, result


def maskbench(folder: Path, model_dir: Path, seconds: float, limit: int, jobs: int) -> dict[str, Any]:
    import multiprocessing

    names = sorted(str(p) for p in folder.glob("*.json"))
    names = names[:limit] if limit else names
    work = [(name, model_dir, seconds) for name in names]
    results = {}
    with multiprocessing.get_context("fork").Pool(jobs, maxtasksperchild=200) as pool:
        for name, result in pool.imap_unordered(_maskbench_one, work, chunksize=4):
            results[name] = result
            if len(results) % 100 == 0:
                print(f"{len(results)}/{len(work)}", file=sys.stderr, flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "src",
        type=Path,
        help="Schema Store's src/ (schemas/json, test, negative_test), or MaskBench's data/ with --maskbench",
    )
    parser.add_argument("--maskbench", action="store_true", help="src is MaskBench's data/")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--seconds", type=float, default=2.0, help="CPU allowance per compile (the server's)")
    parser.add_argument("--limit", type=int, default=0)
    args = parser.parse_args()
    if args.maskbench:
        results = maskbench(args.src, args.model_dir, args.seconds, args.limit, args.jobs)
    else:
        results = schema_store(args.src, args.model_dir, args.seconds, args.limit)
    write(results, args.out)


def schema_store(src: Path, model_dir: Path, seconds: float, limit: int) -> dict[str, Any]:
    vocab = vocabulary(model_dir)
    results: dict[str, Any] = {}
    names = sorted(p.name for p in (src / "test").iterdir() if p.is_dir())
    for name in names[:limit] if limit else names:
        path = src / "schemas" / "json" / f"{name}.json"
        if not path.exists() or path.stat().st_size > MAX_SCHEMA_BYTES:
            continue
        valid, invalid = instances(src, "test", name), instances(src, "negative_test", name)
        if not valid and not invalid:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        # As written, as MaskBench's are: members come in any order, so each instance's own fits.
        results[name] = check(text, valid, invalid, vocab, seconds, as_written=True)
        results[name].update(valid=len(valid), invalid=len(invalid))
    return results


def summarise(results: dict[str, Any]) -> dict[str, Any]:
    compiled = [r for r in results.values() if r["compiled"]]
    times = np.array([r["cpu_s"] for r in compiled]) if compiled else np.zeros(1)
    summary = {
        "schemas": len(results),
        "compiled": len(compiled),
        "handled": sum(r.get("handled", False) for r in results.values()),
        "handled_share": round(
            sum(r.get("handled", False) for r in results.values()) / max(len(results), 1), 3
        ),
        "valid_instances": sum(r["valid"] for r in results.values()),
        "invalid_instances": sum(r["invalid"] for r in results.values()),
        "valid_refused_by_compiled": sum(len(r["valid_refused"]) for r in compiled),
        "of_them_admitted_in_another_member_order": sum(
            len(r.get("valid_in_another_order", [])) for r in compiled
        ),
        "invalid_admitted": sum(len(r["invalid_admitted"]) for r in compiled),
        "undecided": sum(r["undecided"] for r in compiled),
        "compile_first_mask_cpu_s": {
            "p50": round(float(np.percentile(times, 50)), 4),
            "p99": round(float(np.percentile(times, 99)), 4),
            "max": round(float(times.max()), 4),
        },
        "refused_by_reason": dict(
            collections.Counter(r["reason"] for r in results.values() if not r["compiled"]).most_common()
        ),
    }
    return summary


def write(results: dict[str, Any], out: Path) -> None:
    summary = summarise(results)
    splits = sorted({r["split"] for r in results.values() if "split" in r})
    if splits:
        keys = ("schemas", "compiled", "handled", "handled_share")
        summary["splits"] = {}
        for split in splits:
            part = summarise({n: r for n, r in results.items() if r["split"] == split})
            summary["splits"][split] = {k: part[k] for k in keys}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"summary": summary, "results": dict(sorted(results.items()))}, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
