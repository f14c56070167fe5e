"""Issue #42's CPU proxy without a sampler: the engine worker thread's CPU, split by clocks.

py-spy's split of the worker (bench/worker_profile.py) is what the issue names, but its shares move
by several points between runs of one tree, and with `--nonblocking` it loses the caller of a
resumed generator (a job body's samples then count for no thread). This measures the same split
with the worker thread's own CPU clock (`time.thread_time`), deterministically enough to A/B small
changes: JOBS Generate jobs (16-token prompts, NEW greedy tokens each) submitted at once to the real
`Scheduler` over the tiny generated model with 64 KV slots (so ~JOBS - 64 wait for a slot), their
events read on an event loop as a gRPC call reads them (`Scheduler.batches`). Per decode row:
- engine step: inside `Scheduler._step` (the engine: forwards, choices, session operations);
- jobs: inside a job body's `send`/`throw` (tokens out, stop checks, the rows it asks for);
- scheduler bookkeeping: the rest of the worker's CPU (walking jobs, answering them, handing
  events out).
What the clocks around each send cost (~1.2 us on this VM: two reads of the thread's CPU clock) is
taken off both, as measured on an empty generator in the same process.
The shares are of the worker's Python: its CPU less onnxruntime's runs, which release the GIL and
so are not among py-spy's `--gil` samples either (`shares_of_cpu`: of all its CPU).

    python -m bench.scheduler.worker_split --roots /tmp/base,. --rounds 3 --out DIR

Each root (a checkout: its `service`/`engine` are imported) runs in a process of its own, the roots
alternated ROUNDS times.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

PROMPT, SLOTS = 16, 64


class Clocked:
    """A job body whose `send`/`throw` add the worker's CPU spent inside them to `spent[0]` and
    count themselves in `spent[1]`."""

    def __init__(self, body: Any, spent: list[float]) -> None:
        self._body, self._spent = body, spent

    def send(self, value: Any) -> Any:
        return self._clocked(self._body.send, value)

    def throw(self, error: BaseException) -> Any:
        return self._clocked(self._body.throw, error)

    def _clocked(self, call: Any, argument: Any) -> Any:
        start = time.thread_time()
        try:
            return call(argument)
        finally:
            self._spent[0] += time.thread_time() - start
            self._spent[1] += 1

    def close(self) -> None:
        self._body.close()


def wrapper_cost(calls: int = 200_000) -> tuple[float, float]:
    """What `Clocked` adds per send, from an empty generator sent to plainly and through it: seconds
    outside its clock (charged to the rest of the worker, so taken off the bookkeeping) and seconds
    inside it beyond the send itself (the clock reads' own share, taken off the jobs)."""

    def empty() -> Any:
        while True:
            yield None

    best = (float("inf"), 0.0)
    for _ in range(5):
        plain, spent = empty(), [0.0, 0]
        clocked = Clocked(empty(), spent)
        next(plain), next(clocked._body)
        start = time.thread_time()
        for _ in range(calls):
            plain.send(None)
        bare = time.thread_time() - start
        start = time.thread_time()
        for _ in range(calls):
            clocked.send(None)
        through = time.thread_time() - start
        outside, inside = through - spent[0], spent[0] - bare
        if outside < best[0]:
            best = (outside, inside)
    return max(best[0], 0.0) / calls, max(best[1], 0.0) / calls


def measure(jobs: int, new: int) -> dict[str, Any]:
    """One run in this process, with `service` and `engine` of the working directory's tree."""
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

    configure_logging("warning")
    model = build_synthetic(TINY, Path("/tmp/tinymodels"), context_length=1024)
    options = EngineOptions(capacity=1024, max_sessions=SLOTS, intra_op_threads=1)
    info = load_model_info(model)
    engine = Engine(info, options, CudaBackend(info, options, host_runtime()))
    in_step, in_jobs = [0.0], [0.0, 0]  # seconds in steps; seconds in job bodies, their sends
    step = Scheduler._step

    def timed_step(self: Any, work: Any) -> Any:
        start = time.thread_time()
        try:
            return step(self, work)
        finally:
            in_step[0] += time.thread_time() - start

    submit = Scheduler.submit

    def clocked_submit(self: Any, body: Any, **kwargs: Any) -> Any:
        clocked: Any = Clocked(body, in_jobs)  # a body as far as the scheduler looks
        return submit(self, clocked, **kwargs)

    import onnxruntime as ort

    in_ort = [0.0]
    run_with_iobinding = ort.InferenceSession.run_with_iobinding

    def timed_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.thread_time()
        try:
            return run_with_iobinding(self, *args, **kwargs)
        finally:
            in_ort[0] += time.thread_time() - start

    ort.InferenceSession.run_with_iobinding = timed_run
    Scheduler._step = timed_step  # type: ignore[method-assign,assignment]
    Scheduler.submit = clocked_submit  # type: ignore[method-assign]
    scheduler = Scheduler(engine, max_queue=jobs + 16)
    served = SimpleNamespace(tokenizer=None, capacity=engine.capacity, eos_ids=frozenset(), draft_tokens=0)

    async def one(i: int) -> None:
        prompt = [(7 * i + j) % 500 + 1 for j in range(PROMPT)]
        body = generate_body(
            served,  # type: ignore[arg-type]
            prompt,
            [Sampler(SamplingParams())],
            Stopping(new, ignore_eos=True),
            speculate=False,
        )
        async for _ in scheduler.batches(body):
            pass

    async def run(count: int) -> tuple[float, float, float, int, int, float, float]:
        before = await scheduler.call(time.thread_time)
        marks = (
            in_step[0],
            in_jobs[0],
            in_jobs[1],
            engine.stats().decode.steps,
            time.perf_counter(),
            in_ort[0],
        )
        await asyncio.gather(*(one(i) for i in range(count)))
        after = await scheduler.call(time.thread_time)
        return (
            after - before,
            in_step[0] - marks[0],
            in_jobs[0] - marks[1],
            int(in_jobs[1] - marks[2]),
            engine.stats().decode.steps - marks[3],
            time.perf_counter() - marks[4],
            in_ort[0] - marks[5],
        )

    try:
        asyncio.run(run(SLOTS))  # warm-up: every shape prepared
        total, stepped, jobbed, sent, steps, wall, forwards = asyncio.run(run(jobs))
        outside, inside = wrapper_cost()
    finally:
        scheduler.stop()
    rows = jobs * new
    jobbed -= inside * sent  # the clocks' own cost is neither the jobs' nor the scheduler's
    kept = total - stepped - jobbed - (outside + inside) * sent
    return {
        "worker_cpu_s": total,
        "wall_s": wall,
        "decode_steps": steps,
        "rows_per_step": rows / steps,
        "us_per_row": {
            "engine step": 1e6 * stepped / rows,
            "jobs": 1e6 * jobbed / rows,
            "scheduler bookkeeping": 1e6 * kept / rows,
        },
        "onnxruntime_us_per_row": 1e6 * forwards / rows,
        "shares": {  # of the worker's Python: its CPU less onnxruntime's runs (what py-spy --gil samples)
            "engine step": round((stepped - forwards) / (total - forwards), 3),
            "jobs": round(jobbed / (total - forwards), 3),
            "scheduler bookkeeping": round(kept / (total - forwards), 3),
        },
        "shares_of_cpu": {
            "engine step": round(stepped / total, 3),
            "jobs": round(jobbed / total, 3),
            "scheduler bookkeeping": round(kept / total, 3),
        },
        "clock_us_per_send": {"outside": 1e6 * outside, "inside": 1e6 * inside},
        "sends": sent,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--roots", default=".", help="checkouts to compare, comma-separated (a label each: its path)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=1200)
    parser.add_argument("--new", type=int, default=100)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one run, JSON out
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.jobs, args.new)))
        return
    runs: list[dict[str, Any]] = []
    for round_ in range(1, args.rounds + 1):
        for root in args.roots.split(","):
            here = Path(__file__).resolve().parents[2]
            command = [sys.executable, str(here / "bench/scheduler/worker_split.py"), "--one"]
            command += ["--jobs", str(args.jobs), "--new", str(args.new)]
            done = subprocess.run(
                command,
                cwd=root,
                env={"PYTHONPATH": str(Path(root).resolve())},
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                sys.exit(f"{root}: {done.stderr[-2000:]}")
            run = {"root": root, "round": round_, **json.loads(done.stdout.splitlines()[-1])}
            runs.append(run)
            split = run["us_per_row"]
            print(
                f"round {round_} {root}: per row engine step {split['engine step']:.2f} us, jobs "
                f"{split['jobs']:.2f} us, bookkeeping {split['scheduler bookkeeping']:.2f} us "
                f"(onnxruntime {run['onnxruntime_us_per_row']:.2f} us); bookkeeping "
                f"{100 * run['shares']['scheduler bookkeeping']:.1f} % of the worker's Python",
                flush=True,
            )
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        result = {
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "host": platform.node(),
            "command": " ".join(sys.argv),
            "runs": runs,
        }
        (args.out / "worker-split.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
