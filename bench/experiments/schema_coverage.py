"""How many real-world JSON Schemas the structured-output compiler takes (issue #41): each schema of
a directory (JSON Schema Store's `src/schemas/json`, say) compiled as a `json_schema` constraint on a
byte-level vocabulary, within a CPU allowance; what is refused, by reason and by keyword.

    git -C <schemastore> archive HEAD src/schemas/json | tar -x -C /tmp/schemastore
    python -m bench.experiments.schema_coverage /tmp/schemastore/src/schemas/json \
        --out bench/results/<dir>/now.json

Run it again with an older engine first on the path (`git archive <rev> engine | tar -x -C /tmp/old`,
`PYTHONPATH=/tmp/old`) to measure before and after on the same schemas.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import time
from pathlib import Path
from typing import Any

from engine.constrain import Vocabulary, compile_constraint
from engine.constrain.budget import Budget
from engine.errors import InvalidInput

MAX_SCHEMA_BYTES = 64 * 1024


def byte_vocabulary() -> Vocabulary:
    """Every single byte, and a few multi-byte pieces, as tokens; an end-of-sequence token."""
    pieces = [bytes([b]) for b in range(256)] + [b'": "', b'", "', b"true", b"false", b"null"]
    return Vocabulary([*pieces, b"</s>"], len(pieces) + 1, [len(pieces)])


def outcome(text: str, vocabulary: Vocabulary, seconds: float) -> dict[str, Any]:
    budget = Budget(seconds)
    budget.start()
    started = time.thread_time()
    try:
        compile_constraint("json_schema", text, vocabulary, budget=budget)
        result: dict[str, Any] = {"compiled": True}
    except InvalidInput as exc:
        found = re.search(r"'([^']+)'", str(exc))
        result = {
            "compiled": False,
            "reason": exc.reason,
            "keyword": found.group(1) if found else "",
            "message": str(exc)[:200],
        }
    result["cpu_s"] = round(time.thread_time() - started, 4)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("schemas", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=0, help="the first N schemas by name (0: all)")
    parser.add_argument("--seconds", type=float, default=2.0, help="CPU allowance per compile")
    args = parser.parse_args()
    vocabulary = byte_vocabulary()
    files = sorted(p for p in args.schemas.glob("*.json") if p.stat().st_size <= MAX_SCHEMA_BYTES)
    files = files[: args.limit] if args.limit else files
    results = {}
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        results[path.name] = outcome(text, vocabulary, args.seconds)
    compiled = sum(r["compiled"] for r in results.values())
    reasons = collections.Counter(r["reason"] for r in results.values() if not r["compiled"])
    keywords = collections.Counter(
        r["keyword"] for r in results.values() if not r["compiled"] and r["reason"] == "SCHEMA_UNSUPPORTED"
    )
    share = round(compiled / max(len(results), 1), 3)
    summary = {
        "schemas": len(results),
        "compiled": compiled,
        "share": share,
        "refused_by_reason": dict(reasons.most_common()),
        "unsupported_by_keyword": dict(keywords.most_common(25)),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"summary": summary, "results": results}, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
