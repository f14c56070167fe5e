"""A PNG of one CPU benchmark json: TTFT per prompt length, decode rate, peak RSS per runtime.

Usage: python -m bench.cpu.plot bench/results/cpu-<date>/cpu-<date>.json  (needs matplotlib; bench only)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

RUNTIMES = ["ladder fp32", "onnxruntime-genai fp32", "ladder int4", "onnxruntime-genai int4", "llama.cpp"]


def plot(doc: dict[str, Any], out: Path) -> None:
    results = {k: v for k, v in doc["results"].items() if k in RUNTIMES and "error" not in v}
    names = list(results)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    lengths = list(next(iter(results.values()))["ttft_s"])
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        xs = [j + i * width for j in range(len(lengths))]
        axes[0].bar(xs, [results[name]["ttft_s"][n] for n in lengths], width, label=name)
    axes[0].set_xticks([j + 0.4 - width / 2 for j in range(len(lengths))], [f"{n} tokens" for n in lengths])
    axes[0].set_ylabel("TTFT, s (lower is better)")
    axes[0].legend(fontsize=8)
    axes[1].barh(names, [results[n]["decode_tok_s"] for n in names])
    axes[1].set_xlabel("decode tok/s, 128 after 1000 (higher is better)")
    rss = {
        **{n: results[n]["peak_rss_mb"] for n in names},
        **{k: v["peak_rss_mb"] for k, v in doc["results"].items() if "4000" in k},
    }
    axes[2].barh(list(rss), list(rss.values()))
    axes[2].set_xlabel("peak RSS, MB")
    fig.suptitle(
        f"SmolLM2-135M on {doc['machine']['cpu']} x{doc['machine']['cores']}, "
        f"{doc['date']} (commit {doc['commit']})"
    )
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def main() -> None:
    source = Path(sys.argv[1])
    plot(json.loads(source.read_text()), source.with_suffix(".png"))


if __name__ == "__main__":
    main()
