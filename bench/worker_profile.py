"""Where the engine worker's thread spends its samples, from a py-spy raw profile (issue #42's CPU
proxy: "scheduler bookkeeping <= 15 % of the worker's samples").

    python -m bench.worker_profile PROFILE.txt [PROFILE.txt ...]

PROFILE.txt is `py-spy record --format raw` of a server (bench/serving.py's `--attach`). A sample
is the worker's when its stack holds `Scheduler._run`. Each worker sample is one of:
- engine step: inside `Scheduler._step` (the engine's forwards, choices and session operations);
- jobs: below the scheduler's last frame, in other project code (a job's generator body:
  tokens to text, stop strings, progress; the metrics a forward reports);
- scheduler bookkeeping: the rest, the scheduler's own code (service/worker/scheduler.py, rounds.py,
  jobs.py, answers.py) and what it calls outside the project (builtins, dataclass constructors,
  queues): walking jobs, granting slots, handing events out.

`rootless_samples` counts stacks that do not start at a thread's entry: py-spy `--nonblocking`
reads a resumed generator's frames without their caller (a job body, then counted for no thread,
which inflated the bookkeeping share to 16-19 % where the whole stacks give 11-13 %), so profile
without it (bench/scheduler/profile_ab.sh).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

SCHEDULER_FILES = (
    "service/worker/scheduler.py",
    "service/worker/rounds.py",
    "service/worker/jobs.py",
    "service/worker/answers.py",
)
ROOTS = ("<module> ", "_run_module_as_main ", "Thread._bootstrap ")  # where a whole stack starts
PROJECT = re.compile(r"\((?:.*/)?(service|engine)/[^ )]+\.py:\d+\)")


def kind(frames: list[str]) -> str | None:
    """The share a sample counts toward (None: not the worker's)."""
    if not any(f.startswith("Scheduler._run ") for f in frames):
        return None
    if any(f.startswith("Scheduler._step ") for f in frames):
        return "engine step"
    last = max(i for i, f in enumerate(frames) if any(name in f for name in SCHEDULER_FILES))
    if any(PROJECT.search(f) and not any(name in f for name in SCHEDULER_FILES) for f in frames[last + 1 :]):
        return "jobs"
    return "scheduler bookkeeping"


def shares(path: Path) -> dict[str, object]:
    counts: Counter[str] = Counter()
    top: Counter[str] = Counter()
    rootless = 0
    for line in path.read_text().splitlines():
        stack, _, number = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        rootless += 0 if frames[0].startswith(ROOTS) else int(number)
        share = kind(frames)
        if share is None:
            continue
        counts[share] += int(number)
        if share == "scheduler bookkeeping":
            top[frames[-1]] += int(number)
    worker = sum(counts.values())
    return {
        "profile": str(path),
        "worker_samples": worker,
        **{k: {"samples": v, "share": round(v / worker, 3)} for k, v in sorted(counts.items())},
        "bookkeeping_leaves": top.most_common(8),
        "rootless_samples": rootless,
    }


def event_loop(path: Path, top: int = 12) -> dict[str, object]:
    """The main thread's busy samples (its event loop; the waits in the selector left out), and the
    functions they were in (each counted once per sample, those of every sample left out): what the
    core's loop spends its CPU on.
    For a profile taken without `--gil` (py-spy samples every running thread)."""
    inside: Counter[str] = Counter()
    busy = 0
    for line in path.read_text().splitlines():
        stack, _, number = line.rpartition(" ")
        frames = stack.split(";")
        if not stack or not frames[0].startswith(("<module> ", "_run_module_as_main ")):
            continue
        if frames[-1].startswith("EpollSelector.select "):
            continue
        busy += int(number)
        for name in {re.sub(r":\d+\)", ")", f) for f in frames}:
            inside[name] += int(number)
    shared = [(name, n) for name, n in inside.most_common() if n < busy]  # not the loop's own frames
    return {"profile": str(path), "busy_samples": busy, "inside": shared[:top]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("profiles", nargs="+", type=Path)
    parser.add_argument("--event-loop", action="store_true", help="the main thread's event loop instead")
    args = parser.parse_args()
    for path in args.profiles:
        print(json.dumps(event_loop(path) if args.event_loop else shares(path), indent=1))


if __name__ == "__main__":
    main()
