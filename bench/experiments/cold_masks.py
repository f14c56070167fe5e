"""What a constraint's masks cost the first time its states are reached (a schema new to the server)
and once they are cached: one instance of bench.structured's schema walked token by token on the
default model's vocabulary, `allowed()` then `advance()` per token, a fresh compile per repeat.

    python -m bench.experiments.cold_masks [--schema closed|open] [--repeats 3]

Prints ms per token cold (the first walk of each compile) and cached (a second walk of the same
tokens), and which engine the schema compiled to.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench.schema_instances import DEFAULT_MODEL, vocabulary
from bench.structured import SCHEMAS
from engine.constrain import compile_constraint
from engine.tokenizer import Tokenizer

INSTANCE = {
    "id": 7,
    "name": "Ada Lovelace",
    "email": "ada@example.com",
    "age": 36,
    "active": True,
    "role": "admin",
    "score": 9.5,
    "tags": ["math", "code"],
    "created": "1843-07-01",
    "note": None,
}


def walk(compiled: object, ids: list[int]) -> float:
    row = compiled.start()  # type: ignore[attr-defined]
    started = time.perf_counter()
    for token in ids:
        if not row.allowed()[token]:
            raise SystemExit(f"token {token} refused: the instance does not fit the schema")
        row.advance(token)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--schema", choices=("closed", "open"), default="closed")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    vocab = vocabulary(args.model_dir)
    vocab.layout  # noqa: B018  built once per vocabulary (at model load), not per constraint
    ids = Tokenizer(args.model_dir).encode(json.dumps(INSTANCE))
    cold = cached = 0.0
    engine = ""
    for _ in range(args.repeats):
        compiled = compile_constraint("json_schema", json.dumps(SCHEMAS[args.schema]), vocab)
        engine = type(compiled).__name__
        cold += walk(compiled, ids)
        cached += walk(compiled, ids)
    per = 1000 / (args.repeats * len(ids))
    print(
        f"{args.schema} ({engine}), {len(ids)} tokens: cold {cold * per:.2f} ms a token, "
        f"cached {cached * per:.3f} ms a token"
    )


if __name__ == "__main__":
    main()
