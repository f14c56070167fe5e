"""What the measured exactness rules cost: one stream's greedy decode on a CPU, its forwards one
row wide against two (`least_decode_batch` 2: where MLAS' one-row kernel gives other numerics, a lone
stream decodes beside an empty KV slot), alternated in one process so both see the same machine.

    .venv/bin/python -m bench.experiments.kernel_rules [--model DIR] [--tokens 128] [--rounds 3]

Prints the engine's measured rules and a JSON line per round, then the median ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

from engine.executor import DecodeRow, EngineOptions
from engine.executor.engine import Engine
from engine.executor.kernels import probe_ids
from engine.sampling import Sampler, SamplingParams

DEFAULT = Path(".pytest_cache/d/ladder-default-model/models/smollm2-135m-instruct-int4-ctx4096")


def decode_rate(engine: Engine, least: int, tokens: int) -> float:
    """Greedy tokens per second of one stream, every forward at least `least` rows wide."""
    engine.follow(replace(engine.kernels, least_decode_batch=least))
    session = engine.open_session()
    try:
        engine.append(session, probe_ids(engine.info.vocab_size))
        token = int(engine.logits(session).argmax())
        started = time.perf_counter()
        for _ in range(tokens):
            (chosen,) = engine.decode([DecodeRow(session, token, Sampler(SamplingParams()))])
            token = int(chosen or 0)
        return tokens / (time.perf_counter() - started)
    finally:
        engine.close_session(session, keep=False)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=DEFAULT)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    engine = Engine.load(args.model, EngineOptions(max_sessions=4, capacity=1024))
    rules = engine.kernels
    print(
        json.dumps(
            {
                "restore_rule": rules.restore_rule,
                "least_decode_batch": rules.least_decode_batch,
                "one_row_gap": rules.one_row_gap,
                "re_run_gap": rules.re_run_gap,
            }
        )
    )
    ratios = []
    for round_ in range(args.rounds):
        one, two = decode_rate(engine, 1, args.tokens), decode_rate(engine, 2, args.tokens)
        ratios.append(two / one)
        print(json.dumps({"round": round_, "one_row_tok_s": round(one, 1), "two_rows_tok_s": round(two, 1)}))
    print(json.dumps({"median_two_over_one": round(statistics.median(ratios), 3)}))
    engine.close()


if __name__ == "__main__":
    main()
