"""An SVG of an open-loop sweep: latency percentiles against output tok/s, one point per rate.

Plain SVG text, no plotting library. Usage: python -m bench.serving_plot bench/results/<run>/sweep-grpc.json
"""

from __future__ import annotations

import json
import math
import sys
from html import escape
from pathlib import Path
from typing import Any

WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 640, 400, 70, 170, 40, 50
SERIES = (
    ("ttft_ms", "p50", "TTFT p50", "#1f77b4", ""),
    ("ttft_ms", "p99", "TTFT p99", "#1f77b4", "6 4"),
    ("itl_ms", "p50", "inter-token p50", "#d62728", ""),
    ("itl_ms", "p99", "inter-token p99", "#d62728", "6 4"),
)


def ticks(high: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least `high` (steps of 1, 2 or 5 times a power of ten)."""
    raw = max(high, 1e-9) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [i * step for i in range(math.ceil(high / step) + 1)]


def points(loads: dict[str, Any], group: str, q: str) -> list[tuple[float, float]]:
    found = [
        (row["output_tok_s"], row[group][q])
        for row in loads.values()
        if row.get("rate") is not None and row[group][q] is not None
    ]
    return sorted(found)


def svg(loads: dict[str, Any], title: str) -> str:
    every = [p for g, q, *_ in SERIES for p in points(loads, g, q)]
    xs, ys = ticks(max(x for x, _ in every)), ticks(max(y for _, y in every))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def at(x: float, y: float) -> tuple[float, float]:
        return round(LEFT + plot_w * x / xs[-1], 1), round(TOP + plot_h * (1 - y / ys[-1]), 1)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'font-family="sans-serif" font-size="11"><rect width="100%" height="100%" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="20" text-anchor="middle" font-size="13">{escape(title)}</text>',
    ]
    parts += _grid(xs, ys, at)
    for i, (group, q, label, colour, dash) in enumerate(SERIES):
        line = points(loads, group, q)
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="2" stroke-dasharray="{dash}" '
            f'points="{" ".join(_pair(at(x, y)) for x, y in line)}"/>'
        )
        parts += [_dot(at(x, y), colour) for x, y in line]
        y = TOP + 10 + 18 * i
        parts.append(
            f'<line x1="{WIDTH - RIGHT + 15}" y1="{y}" x2="{WIDTH - RIGHT + 40}" y2="{y}" '
            f'stroke="{colour}" stroke-width="2" stroke-dasharray="{dash}"/>'
            f'<text x="{WIDTH - RIGHT + 45}" y="{y + 4}">{label}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _pair(point: tuple[float, float]) -> str:
    return f"{point[0]},{point[1]}"


def _dot(point: tuple[float, float], colour: str) -> str:
    return f'<circle cx="{point[0]}" cy="{point[1]}" r="3" fill="{colour}"/>'


def _grid(xs: list[float], ys: list[float], at: Any) -> list[str]:
    out = []
    for x in xs:
        px = at(x, 0)[0]
        out.append(
            f'<line x1="{px}" y1="{TOP}" x2="{px}" y2="{HEIGHT - BOTTOM}" stroke="#ddd"/>'
            f'<text x="{px}" y="{HEIGHT - BOTTOM + 15}" text-anchor="middle">{x:g}</text>'
        )
    for y in ys:
        py = at(0, y)[1]
        out.append(
            f'<line x1="{LEFT}" y1="{py}" x2="{WIDTH - RIGHT}" y2="{py}" stroke="#ddd"/>'
            f'<text x="{LEFT - 5}" y="{py + 4}" text-anchor="end">{y:g}</text>'
        )
    out.append(
        f'<text x="{LEFT + (WIDTH - LEFT - RIGHT) / 2}" y="{HEIGHT - 12}" text-anchor="middle">'
        "output tokens / s (one point per request rate)</text>"
    )
    out.append(
        f'<text transform="translate(16,{TOP + (HEIGHT - TOP - BOTTOM) / 2}) rotate(-90)" '
        'text-anchor="middle">latency, ms</text>'
    )
    return out


def write(path: Path) -> Path:
    result = json.loads(path.read_text())
    where = result["machine"].get("gpu") or f"CPU, {result['machine']['cpus']} cores"
    out = path.with_suffix(".svg")
    out.write_text(svg(result["loads"], f"Open loop over {result['protocol']} — {where}"))
    return out


if __name__ == "__main__":
    print(write(Path(sys.argv[1])))
