"""A markdown table of every open-loop sweep under a folder (bench/serving.py's sweep JSON), one row
per run and rate: what the client saw and what the server spent.

Usage: python -m bench.serving_table bench/results/<run>/
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HEADER = (
    "| run | rate | asked tok/s | output tok/s while arriving | all | TTFT p50 / p99 ms | "
    "inter-token p50 / p99 ms | "
    "client / server (core: busiest thread) cores | decode steps/s | rows/step |"
)


def cell(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def row(run: str, load: dict[str, Any]) -> str:
    ttft, itl = load["ttft_ms"], load["itl_ms"]
    return (
        f"| {run} | {load['rate'] or 'burst'} | {cell(load.get('asked_tok_s'), 0)} | "
        f"{cell(load.get('window_tok_s'), 0)} | {cell(load['output_tok_s'], 0)} | "
        f"{cell(ttft['p50'])} / {cell(ttft['p99'])} | {cell(itl['p50'], 2)} / {cell(itl['p99'], 2)} | "
        f"{cell(load.get('client_cores'), 2)} / {cell(load.get('server_cores'), 2)}{core(load)} | "
        f"{cell(load.get('decode_steps_s'), 0)} | {cell(load.get('rows_per_step'))} |"
    )


def core(load: dict[str, Any]) -> str:
    """The cores of the engine's process in brackets, where the server ran gRPC frontends besides it,
    and, where the sweep recorded its threads, the busiest thread's share after a colon."""
    cores, whole = load.get("core_cores"), load.get("server_cores")
    if cores is None or whole is None or whole - cores <= 0.02:
        return ""
    threads = load.get("core_threads") or []
    return f" ({cores:.2f}: {threads[0][1]:.2f})" if threads else f" ({cores:.2f})"


def table(folder: Path) -> str:
    lines = [HEADER, "|" + " --- |" * HEADER.count(" | ") + " --- |"]
    for path in sorted(folder.glob("**/*.json")):
        try:
            found = json.loads(path.read_text())
        except json.JSONDecodeError:
            continue  # JSON lines beside the sweeps (worker shares), not a sweep
        if not isinstance(found, dict) or "loads" not in found:
            continue  # not an open-loop sweep
        where = str(path.parent.relative_to(folder))
        run = where if path.name.startswith("sweep-") and where != "." else path.stem
        lines += [row(run, load) for load in found["loads"].values()]
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(Path(sys.argv[1])))
