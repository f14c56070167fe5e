"""Host time of a decode step outside onnxruntime: the Python a step costs, which the H200's
64-stream decode pays on top of onnxruntime's raw replay (issue 28's 0.85x target).

The CUDA backend's own code runs on the host here (numpy buffers, the CPU provider), on a tiny
synthetic decoder whose forward is short, so what is left besides the forward is the engine's and
the scheduler's Python per step. Two ways, side by side in one process:
- `engine`: `Engine.decode` of B rows, step after step (the engine alone);
- `scheduler`: B Generate bodies (held, as unary calls are) through the real `Scheduler`, each
  asking for `--new` tokens: jobs, rounds, answers, the engine.

    python -m bench.cpu.host_overhead --streams 64 --new 300 --out DIR
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import platform
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import onnxruntime as ort

from bench.stages import timed
from engine.executor import DecodeRow, EngineOptions
from engine.executor.engine import Engine
from engine.executor.step import Open, Prefill, Step
from engine.model import load_model_info
from engine.modelgen.synthetic import TINY, build_synthetic
from engine.runtime.cuda import CudaBackend, host_runtime
from engine.sampling import Sampler, SamplingParams
from service.calls import Stopping
from service.logs import configure_logging
from service.worker.generation import generate_body
from service.worker.scheduler import Scheduler

PROMPT = 20


class RunClock:
    """Seconds spent inside onnxruntime's run (every InferenceSession, this process)."""

    def __init__(self) -> None:
        self._totals: dict[str, float] = defaultdict(float)
        timed(self._totals, "run", ort.InferenceSession, "run_with_iobinding")

    @property
    def seconds(self) -> float:
        return self._totals["run"]


def host_engine(model: Path, slots: int) -> Engine:
    options = EngineOptions(capacity=1024, max_sessions=slots, intra_op_threads=1)
    info = load_model_info(model)
    return Engine(info, options, CudaBackend(info, options, host_runtime()))


def engine_alone(model: Path, streams: int, steps: int, clock: RunClock) -> dict[str, float]:
    engine, greedy = host_engine(model, streams), Sampler(SamplingParams())
    sessions = engine.step(Step(opens=(Open(count=streams),))).opens[0].get()
    last = []
    for session in sessions:
        prefill = Prefill(session, tuple(range(1, PROMPT + 1)), samplers=(greedy,))
        last.append(engine.step(Step(prefills=((prefill, 0),))).prefills[0].get().tokens[0])
    for warm in (True, False):
        before, start = clock.seconds, time.perf_counter()
        for _ in range(5 if warm else steps):
            last = engine.decode([DecodeRow(s, t, greedy) for s, t in zip(sessions, last, strict=True)])
    wall, inside = time.perf_counter() - start, clock.seconds - before
    return {
        "steps": steps,
        "step_ms": wall / steps * 1e3,
        "onnxruntime_ms": inside / steps * 1e3,
        "host_ms": (wall - inside) / steps * 1e3,
    }


def through_scheduler(model: Path, streams: int, new: int, clock: RunClock) -> dict[str, float]:
    engine = host_engine(model, streams)
    scheduler = Scheduler(engine, max_queue=4 * streams)
    served = SimpleNamespace(tokenizer=None, capacity=engine.capacity, eos_ids=frozenset())

    async def one() -> None:
        body = generate_body(
            served,
            list(range(1, PROMPT + 1)),
            [Sampler(SamplingParams())],  # type: ignore[arg-type]
            Stopping(new, ignore_eos=True),
        )
        async for _ in scheduler.stream(body, hold=True):
            pass

    async def burst() -> None:
        await asyncio.gather(*(one() for _ in range(streams)))

    try:
        asyncio.run(burst())  # warm-up: every shape prepared
        steps_before = engine.stats().decode.steps
        before, start = clock.seconds, time.perf_counter()
        asyncio.run(burst())
        wall, inside = time.perf_counter() - start, clock.seconds - before
        steps = engine.stats().decode.steps - steps_before
    finally:
        scheduler.stop()
    return {
        "steps": steps,
        "step_ms": wall / steps * 1e3,
        "onnxruntime_ms": inside / steps * 1e3,
        "host_ms": (wall - inside) / steps * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--new", type=int, default=300)
    parser.add_argument(
        "--repeats", type=int, default=3, help="each way this many times, alternated; the best kept"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    configure_logging("warning")
    model = build_synthetic(TINY, args.out / "model")
    clock = RunClock()
    runs: dict[str, list[dict[str, float]]] = {"engine": [], "scheduler": []}
    for _ in range(args.repeats):
        runs["engine"].append(engine_alone(model, args.streams, args.new, clock))
        runs["scheduler"].append(through_scheduler(model, args.streams, args.new, clock))
    best = {way: min(rows, key=lambda r: r["host_ms"]) for way, rows in runs.items()}
    result = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "command": f"python -m bench.cpu.host_overhead --streams {args.streams} --new {args.new} "
        f"--repeats {args.repeats}",
        "streams": args.streams,
        "best": best,
        "runs": runs,
        "scheduler_host_over_engine_host": best["scheduler"]["host_ms"] / best["engine"]["host_ms"],
    }
    (args.out / "host-overhead.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("best", "scheduler_host_over_engine_host")}, indent=2))


if __name__ == "__main__":
    main()
