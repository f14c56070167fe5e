"""Issue #42: where the engine worker's thread spends its wall time, by cProfile (deterministic).

600 Generate jobs (16-token prompts, 100 greedy tokens) through the real Scheduler over the tiny
model with 64 slots, their events read on an event loop; cProfile runs on the worker thread only.
Made to see the worker's self-pipe writes (`socket.send` of `call_soon_threadsafe`), which give the
interpreter away: run with PYTHONPATH on another checkout to profile that tree.

    python -m bench.experiments.worker_cprofile [--top 30]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from engine.executor import EngineOptions
from engine.executor.engine import Engine
from engine.model import load_model_info
from engine.modelgen.synthetic import TINY, build_synthetic
from engine.runtime.cuda import CudaBackend, host_runtime
from engine.sampling import Sampler, SamplingParams
from service.calls import Stopping
from service.logs import configure_logging
from service.worker.generation import generate_body
from service.worker.scheduler import Scheduler


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=600)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    configure_logging("warning")
    profile = cProfile.Profile()
    run = Scheduler._run

    def profiled(self: Any) -> None:
        profile.enable()
        try:
            run(self)
        finally:
            profile.disable()

    Scheduler._run = profiled  # type: ignore[method-assign]
    model = build_synthetic(TINY, Path("/tmp/tinymodels"), context_length=1024)
    options = EngineOptions(capacity=1024, max_sessions=64, intra_op_threads=1)
    info = load_model_info(model)
    engine = Engine(info, options, CudaBackend(info, options, host_runtime()))
    scheduler = Scheduler(engine, max_queue=args.jobs + 16)
    served: Any = SimpleNamespace(
        tokenizer=None, capacity=engine.capacity, eos_ids=frozenset(), draft_tokens=0
    )

    async def one(i: int) -> None:
        prompt = [(7 * i + j) % 500 + 1 for j in range(16)]
        body = generate_body(
            served, prompt, [Sampler(SamplingParams())], Stopping(100, ignore_eos=True), speculate=False
        )
        async for _ in scheduler.batches(body):
            pass

    async def burst() -> None:
        await asyncio.gather(*(one(i) for i in range(args.jobs)))

    asyncio.run(burst())
    scheduler.stop()
    pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
