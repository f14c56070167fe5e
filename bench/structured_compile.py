"""Structured-output compile cost on the default model's real vocabulary (49,152 tokens).

Prints, for a 10-property JSON schema (and a few other constraints): the compile time (tree,
NFA, DFA), the first mask (the start state), a full walk's masks, and a cached mask's re-use.

    .venv/bin/python bench/structured_compile.py [--model-dir DIR] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from engine.constrain import Compiled, Vocabulary, compile_constraint
from engine.tokenizer import Tokenizer

DEFAULT_MODEL = Path(".pytest_cache/d/ladder-default-model/models/smollm2-135m-instruct-int4-ctx4096")

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "format": "email"},
        "height_m": {"type": "number"},
        "is_member": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "role": {"enum": ["admin", "user", "guest"]},
        "joined": {"type": "string", "format": "date"},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city"],
        },
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    },
    "required": ["name", "age", "email", "is_member", "role"],
}

CONSTRAINTS = {
    "json_schema(10 properties)": ("json_schema", json.dumps(PERSON)),
    "json_schema({})": ("json_schema", "{}"),
    "regex(phone)": ("regex", r"\+?[0-9]{1,3}[ -]?\(?[0-9]{3}\)?[ -]?[0-9]{3}-[0-9]{4}"),
    "choice(3)": ("choice", ["positive", "negative", "neutral"]),
}


def timed(fn: Callable[[], object], repeat: int) -> float:
    """The median wall time of `fn` in milliseconds."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def walk(compiled: Compiled, seed: int = 0) -> int:
    """A random walk through allowed tokens to EOS; returns the tokens taken."""
    rng, row, steps = np.random.default_rng(seed), compiled.start(), 0
    while not row.done and steps < 400:
        row.advance(int(rng.choice(np.flatnonzero(row.allowed()))))
        steps += 1
    return steps


def report(name: str, kind: str, spec: str | list[str], vocabulary: Vocabulary, repeat: int) -> None:
    compile_ms = timed(lambda: compile_constraint(kind, spec, vocabulary), repeat)
    first_ms = timed(lambda: compile_constraint(kind, spec, vocabulary).start().allowed(), repeat)
    compiled = compile_constraint(kind, spec, vocabulary)
    row = compiled.start()
    row.allowed()
    cached_ms = timed(row.allowed, 200)
    started = time.perf_counter()
    steps = walk(compiled)
    walk_ms = (time.perf_counter() - started) * 1000
    states = getattr(getattr(compiled, "dfa", None), "states", "?")
    print(
        f"{name:28} states {states:>6}  compile {compile_ms:7.1f} ms  compile+first mask {first_ms:7.1f} ms"
        f"  cached mask {cached_ms * 1000:6.1f} us  walk {steps} tokens {walk_ms:7.1f} ms"
        f"  nbytes {compiled.nbytes / 1024:7.1f} KiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    tokenizer = Tokenizer(args.model_dir)
    vocabulary = Vocabulary.from_tokenizer(tokenizer, tokenizer.vocab_size, [tokenizer.eos_token_id or 0])
    vocabulary.layout  # noqa: B018  built once per vocabulary (at model load), not per constraint
    print(
        f"vocabulary {vocabulary.size} tokens, {int(vocabulary.usable.sum())} usable, "
        f"width {vocabulary.matrix.shape[1]}"
    )
    for name, (kind, spec) in CONSTRAINTS.items():
        report(name, kind, spec, vocabulary, args.repeat)


if __name__ == "__main__":
    main()
