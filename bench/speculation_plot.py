"""An SVG of bench/speculation.py's runs: decode tok/s per task, off and with speculation, for each
precision measured, side by side (a bar whose tokens parted from the plain run's is hatched).

Plain SVG text, no plotting library. Usage:
    python -m bench.speculation_plot bench/results/speculation-<date>/   # writes speculation.svg there
"""

from __future__ import annotations

import json
import sys
from html import escape
from pathlib import Path
from typing import Any

from bench.serving_plot import ticks

HEIGHT, LEFT, RIGHT, TOP, BOTTOM, BAR, GAP = 390, 60, 20, 60, 70, 13, 22
COLOURS = {("fp32", "off"): "#9ecae1", ("fp32", "lookup"): "#1f77b4", ("int4", "off"): "#fdae6b"}
COLOURS[("int4", "lookup")] = "#e6550d"


def runs(folder: Path) -> dict[str, dict[str, Any]]:
    """Each precision's run, by precision (the files bench/speculation.py writes)."""
    found = {}
    for path in sorted(folder.glob("speculation-*.json")):
        doc = json.loads(path.read_text())
        found[doc["precision"]] = doc
    return found


def svg(docs: dict[str, dict[str, Any]]) -> str:
    tasks = [row["task"] for row in next(iter(docs.values()))["rows"]]
    bars = [(p, mode) for p in docs for mode in ("off", "lookup")]
    group = len(bars) * BAR + GAP
    width = LEFT + RIGHT + group * len(tasks)
    rates = {
        (p, row["task"], mode): (row[f"{mode}_tok_s"], row["same_tokens"] or mode == "off")
        for p, doc in docs.items()
        for row in doc["rows"]
        for mode in ("off", "lookup")
    }
    ys = ticks(max(rate for rate, _ in rates.values()))
    plot_h = HEIGHT - TOP - BOTTOM

    def y_at(value: float) -> float:
        return round(TOP + plot_h * (1 - value / ys[-1]), 1)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{HEIGHT}" '
        'font-family="sans-serif" font-size="11"><rect width="100%" height="100%" fill="white"/>',
        '<defs><pattern id="parted" width="4" height="4" patternUnits="userSpaceOnUse">'
        '<path d="M0,4 L4,0" stroke="white" stroke-width="1"/></pattern></defs>',
        f'<text x="{width / 2}" y="18" text-anchor="middle" font-size="13">'
        "one stream, decode tok/s, speculation off and on (2-core CPU, SmolLM2-135M)</text>",
        f'<text x="{width / 2}" y="34" text-anchor="middle">'
        "hatched: greedy tokens parted from the plain run's "
        "(int4's verification rows are not its decode rows)</text>",
    ]
    for value in ys:
        parts.append(
            f'<line x1="{LEFT}" x2="{width - RIGHT}" y1="{y_at(value)}" y2="{y_at(value)}" stroke="#ddd"/>'
            f'<text x="{LEFT - 6}" y="{y_at(value) + 4}" text-anchor="end">{value:g}</text>'
        )
    for t, task in enumerate(tasks):
        x0 = LEFT + GAP / 2 + t * group
        for b, (precision, mode) in enumerate(bars):
            rate, same = rates[(precision, task, mode)]
            x, top = x0 + b * BAR, y_at(rate)
            box = f'x="{x}" y="{top}" width="{BAR - 1}" height="{round(TOP + plot_h - top, 1)}"'
            parts.append(f'<rect {box} fill="{COLOURS[(precision, mode)]}"/>')
            if not same:
                parts.append(f'<rect {box} fill="url(#parted)"/>')
        parts.append(
            f'<text x="{x0 + len(bars) * BAR / 2}" y="{TOP + plot_h + 16}" text-anchor="middle">'
            f"{escape(task)}</text>"
        )
    for i, (precision, mode) in enumerate(bars):
        x, label = LEFT + i * 120, f"{precision} {'speculating' if mode == 'lookup' else 'off'}"
        parts.append(
            f'<rect x="{x}" y="{HEIGHT - 30}" width="10" height="10" fill="{COLOURS[(precision, mode)]}"/>'
            f'<text x="{x + 14}" y="{HEIGHT - 21}">{label}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts)


def main() -> None:
    folder = Path(sys.argv[1])
    (folder / "speculation.svg").write_text(svg(runs(folder)))


if __name__ == "__main__":
    main()
