"""How `Forwards` runs a forward with `--cuda-wait replay`: the host sleeps through captured
forwards alone (the GPU test, tests/engine/test_cuda_graphs.py, checks the tokens on a device).

The session here records the order of what it is asked, as the driver's schedule switch does:
these tests are about that order, on whichever thread the forward runs."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from engine.runtime.forwards import EAGER, Forwards


class Recorded:
    """Stands for onnxruntime's session and the driver's schedule switch: every call, in order."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[str] = []
        self.threads: set[str] = set()
        self.fail = fail
        self.lock = threading.Lock()

    def run_with_iobinding(self, binding: Any, options: Any) -> None:
        with self.lock:
            self.calls.append(f"run {binding}")
            self.threads.add(threading.current_thread().name)
        if self.fail:
            raise RuntimeError("the forward failed")

    def sleep(self) -> bool:
        self.calls.append("sleep")
        return True

    def spin(self) -> bool:
        self.calls.append("spin")
        return True


@pytest.mark.parametrize("replay_thread", [False, True], ids=["on the worker", "on a runner"])
def test_the_host_sleeps_through_captured_forwards_and_spins_in_every_other(replay_thread: bool) -> None:
    recorded = Recorded()
    forwards = Forwards(recorded, graphs=True, replay_thread=replay_thread, replay_wait=recorded)  # type: ignore[arg-type]
    forwards.run("captured", 3, wait=True)
    forwards.run("eager", EAGER, wait=True)
    forwards.run("launched ahead", 4, wait=False)
    forwards.launched()
    assert recorded.calls == [
        "sleep",
        "run captured",
        "spin",
        "run eager",
        "sleep",
        "run launched ahead",
        "spin",
    ]


def test_a_failed_captured_forward_leaves_the_host_spinning() -> None:
    recorded = Recorded(fail=True)
    forwards = Forwards(recorded, graphs=True, replay_thread=False, replay_wait=recorded)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="the forward failed"):
        forwards.run("captured", 3, wait=True)
    assert recorded.calls == ["sleep", "run captured", "spin"]


def test_without_graphs_or_a_schedule_switch_no_forward_changes_how_the_host_waits() -> None:
    recorded = Recorded()
    Forwards(recorded, graphs=False, replay_thread=False, replay_wait=recorded).run("x", 3, wait=True)  # type: ignore[arg-type]
    Forwards(recorded, graphs=True, replay_thread=False).run("y", 3, wait=True)
    assert recorded.calls == ["run x", "run y"]
