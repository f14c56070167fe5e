"""The CPU backend's choice of a step's sampled tokens (engine.runtime.host_draws) on 1, 2 and 4
threads: ms per step of `rows` rows of the default model's vocabulary size (49,152), flat rows as
random prompts give (top_p 0.95 keeps ~10k tokens) and peaked ones.

    python -m bench.experiments.host_draws [--rows 8] [--steps 50]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from bench.served import machine
from engine.runtime.host_draws import HostDraws
from engine.sampling import Sampler, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--vocab", type=int, default=49152)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    samplers = [Sampler(SamplingParams(temperature=0.8, top_p=0.95, seed=i)) for i in range(args.rows)]
    results = []
    for scale in (1.5, 5.0):
        store = (rng.standard_normal((args.rows, args.vocab)) * scale).astype(np.float32)
        for cores in (1, 2, 4):
            draws = HostDraws(cores)
            histories = [list(range(10 + i)) for i in range(args.rows)]
            draws.choose(lambda i, s=store: s[i], samplers, histories)  # workers started
            wall, cpu = time.perf_counter(), time.process_time()
            for step in range(args.steps):
                draws.choose(lambda i, s=store: s[i], samplers, [h + [step] for h in histories])
            entry = {
                "scale": scale,
                "rows": args.rows,
                "threads": cores,
                "step_ms": (time.perf_counter() - wall) / args.steps * 1e3,
                "cpu_ms": (time.process_time() - cpu) / args.steps * 1e3,
            }
            results.append(entry)
            print(json.dumps(entry), flush=True)
    print(json.dumps({"machine": machine()}))


if __name__ == "__main__":
    main()
