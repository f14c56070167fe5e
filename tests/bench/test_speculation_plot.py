"""bench/speculation_plot.py on the committed run: one bar per task, precision and mode, and the
bars whose tokens parted from the plain run's hatched, as the run's JSON says."""

from __future__ import annotations

import xml.dom.minidom
from pathlib import Path

from bench.speculation_plot import runs, svg

RUN = Path(__file__).resolve().parents[2] / "bench" / "results" / "speculation-2026-12-04"


def test_the_plot_has_a_bar_per_task_precision_and_mode_and_hatches_the_parted_ones() -> None:
    docs = runs(RUN)
    drawn = xml.dom.minidom.parseString(svg(docs))
    rects = [r for r in drawn.getElementsByTagName("rect") if r.getAttribute("width") not in ("100%", "10")]
    hatched = [r for r in rects if r.getAttribute("fill") == "url(#parted)"]
    tasks = len(docs["fp32"]["rows"])
    parted = sum(not row["same_tokens"] for doc in docs.values() for row in doc["rows"])
    assert len(rects) - len(hatched) == tasks * 2 * len(docs)
    assert len(hatched) == parted > 0
    assert (RUN / "speculation.svg").read_text() == svg(docs)  # the committed picture is this run's
