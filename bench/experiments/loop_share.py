"""How much of a process's GIL samples its event loop holds, per decode row served: py-spy raw
profiles (`--format raw --gil`) beside the sweep each run wrote (bench/scheduler/profile_ab.sh).

    python -m bench.experiments.loop_share bench/results/core-sink-2026-12-05/saturated
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def loop_share(profile: Path) -> tuple[int, int]:
    """(all samples, samples under the event loop's `run_forever`)."""
    total = loop = 0
    for line in profile.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        total += int(count)
        loop += int(count) if "run_forever" in stack else 0
    return total, loop


def main(folder: Path) -> None:
    print("| run | GIL samples | event loop | its share | decode rows/s | loop samples per 1,000 rows/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for profile in sorted(folder.glob("py-spy-*.txt")):
        run = profile.stem.removeprefix("py-spy-")
        (load,) = json.loads((folder / run / "sweep-grpc.json").read_text())["loads"].values()
        rows = load["decode_steps_s"] * load["rows_per_step"]
        total, loop = loop_share(profile)
        print(f"| {run} | {total:,} | {loop} | {loop / total:.1%} | {rows:,.0f} | {loop / rows * 1000:.1f} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
