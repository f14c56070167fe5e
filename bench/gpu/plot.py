"""A PNG of the GPU run's TTFT per prompt length: Ladder vs onnxruntime-genai-cuda, seen and new lengths.

Usage: python -m bench.gpu.plot bench/results/gpu-<date>/gpu-<date>.json  (needs matplotlib; bench only)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

PASSES = {"ttft_pass1": "first time", "ttft_pass2": "same lengths again", "ttft_fresh": "new lengths"}


def plot(doc: dict[str, Any], out: Path) -> None:
    models = doc["models"]
    fig, axes = plt.subplots(1, len(models), figsize=(7 * len(models), 4.5), squeeze=False)
    for ax, (name, model) in zip(axes[0], models.items(), strict=True):
        for runtime, style in (("ladder", "-"), ("genai", "--")):
            for key, label in PASSES.items():
                series = model[runtime][key]["ttft_ms"]
                xs = list(range(len(series)))
                ax.plot(
                    xs,
                    list(series.values()),
                    style,
                    marker="o",
                    markersize=3,
                    label=f"{'Ladder' if runtime == 'ladder' else 'genai'}: {label}",
                )
        lengths = list(model["ladder"]["ttft_pass1"]["ttft_ms"])
        ax.set_xticks(range(len(lengths)), lengths, rotation=45)
        ax.set_yscale("log")
        ax.set_title(f"{name}: TTFT per prompt length (H200)")
        ax.set_xlabel("prompt tokens (pass order)")
        ax.set_ylabel("ms (log)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    source = Path(sys.argv[1])
    plot(json.loads(source.read_text()), source.with_suffix(".png"))


if __name__ == "__main__":
    main()
