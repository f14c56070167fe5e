"""bench/gpu/decode_gap.py and bench/cpu/host_overhead.py time a stage by wrapping it
(bench/stages.py): the wrapper must add the call's host time and change nothing the call does."""

from __future__ import annotations

import time
from collections import defaultdict
from types import SimpleNamespace

import pytest

from bench.stages import timed


def test_a_timed_stage_adds_its_host_time_and_returns_what_the_stage_returned() -> None:
    totals: dict[str, float] = defaultdict(float)
    owner = SimpleNamespace(stage=lambda x: (time.sleep(0.01), x * 2)[1])
    timed(totals, "stage", owner, "stage")
    assert owner.stage(21) == 42 and owner.stage(1) == 2
    assert 0.02 <= totals["stage"] < 1.0


def test_a_timed_stage_that_raises_still_counts_its_time_and_raises() -> None:
    totals: dict[str, float] = defaultdict(float)

    def fails() -> None:
        time.sleep(0.01)
        raise ValueError("no")

    owner = SimpleNamespace(stage=fails)
    timed(totals, "stage", owner, "stage")
    with pytest.raises(ValueError, match="no"):
        owner.stage()
    assert totals["stage"] >= 0.01
