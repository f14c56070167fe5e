"""Grammar constraints: what rows wait for masks, with and without the warm-up, on the default
model's vocabulary (49,152 tokens).

For each grammar (tests/engine/data/grammars: JSON and arithmetic), documents the tokenizer
encodes are fed token by token as rows would generate them; each step's mask lookup is timed.
Cold: the grammar as compiled (start mask only). Warmed: after `CompiledGrammar.warm()`, which the
server runs on a thread of its own right after compiling.

    .venv/bin/python -m bench.structured_grammar [--model-dir DIR] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from engine.constrain.grammar import compile_grammar
from engine.constrain.vocabulary import Vocabulary
from engine.tokenizer import Tokenizer

DEFAULT_MODEL = Path(".pytest_cache/d/ladder-default-model/models/smollm2-135m-instruct-int4-ctx4096")
GRAMMARS = Path("tests/engine/data/grammars")
DOCUMENTS = {
    "json": [
        json.dumps(
            {
                "name": "Ada Lovelace",
                "age": 36,
                "tags": ["math", "poetry"],
                "address": {"city": "London", "zip": None},
                "score": -12.5e3,
                "ok": True,
            }
        ),
        json.dumps([{"id": i, "v": [i, i * 2.5]} for i in range(3)], indent=2),
        json.dumps({"a": {"b": {"c": [1, {"d": "é\n"}]}}}, indent=1),
    ],
    "arithmetic": ["(12.5 + 3) * -4 / (2 - 0.25)", "1+2*3-4/5", "((7 * (8 - 9.75)) + 100) / 3.14159"],
}


def mask_times(name: str, vocabulary: Vocabulary, tokenizer: Tokenizer, warm: bool) -> dict[str, float]:
    grammar = compile_grammar((GRAMMARS / f"{name}.gbnf").read_text(), vocabulary)
    started = time.perf_counter()
    first_ms = _ms(started, grammar.start().allowed)
    started = time.perf_counter()
    warmed = grammar.warm() if warm else 0
    warm_s = time.perf_counter() - started
    before, times = grammar.masks_cached, []
    for document in DOCUMENTS[name]:
        row = grammar.start()
        for token in tokenizer.encode(document):
            times.append(_ms(time.perf_counter(), row.allowed))
            row.advance(token)
        assert row.accepts, document
    return {
        "first mask ms": first_ms,
        "warmed": warmed,
        "warm s": warm_s,
        "tokens": len(times),
        "masks rows computed": grammar.masks_cached - before,
        "mask ms total": sum(times),
        "mask ms p90": float(np.percentile(times, 90)),
        "mask ms max": max(times),
    }


def _ms(started: float, fn: Callable[[], object]) -> float:
    fn()
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    tokenizer = Tokenizer(args.model_dir)
    vocabulary = Vocabulary.from_tokenizer(tokenizer, tokenizer.vocab_size, [tokenizer.eos_token_id or 0])
    for name in DOCUMENTS:
        for warm in (False, True):
            runs = [mask_times(name, vocabulary, tokenizer, warm) for _ in range(args.repeat)]
            medians = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
            print(json.dumps({"grammar": name, "warm": warm, **{k: round(v, 2) for k, v in medians.items()}}))


if __name__ == "__main__":
    main()
