"""A PNG of a batching run: aggregate tok/s per concurrent calls, beside the raw replay and the last release.

Usage: python -m bench.batching_plot bench/results/gpu-batching-<date>/batching.json  (needs matplotlib)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)


def series(rows: dict[str, Any], key: str) -> tuple[list[int], list[float]]:
    points = sorted((int(n), row[key]) for n, row in rows.items() if row.get(key))
    return [n for n, _ in points], [v for _, v in points]


def main(path: Path) -> Path:
    result = json.loads(path.read_text())
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for key, label, style in (
        ("steady_tok_s", "Ladder, every call decoding", "o-"),
        ("end_to_end_tok_s", "Ladder, end to end (prefill included)", "s--"),
    ):
        ax.plot(*series(result["scaling"], key), style, label=label)
    if "raw_replay" in result:
        ax.plot(*series(result["raw_replay"], "tok_s"), "k:", label="onnxruntime alone: batched graph replay")
    if "baseline" in result:
        ax.plot(
            *series(result["baseline"]["scaling"], "end_to_end_tok_s"),
            "x-",
            color="grey",
            label="previous release (one decode at a time), end to end",
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrent Generate calls (512-token prompts, 128 new tokens each)")
    ax.set_ylabel("generated tokens / s, all calls together")
    ax.set_title(f"Continuous batching through the service — {result['machine'].get('gpu') or 'CPU'}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    out = path.with_suffix(".png")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    return out


if __name__ == "__main__":
    print(main(Path(sys.argv[1])))
