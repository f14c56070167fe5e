"""How the CUDA backend's forwards run: with which run options, on which thread, waited for or not.

onnxruntime's graph replay waits for its forward before it returns (cuda_graph.cc, 1.31), so on
the engine worker's thread a captured forward and the step's host work take turns. With
`replay_thread` every captured forward (its capture too: the CUDA provider keeps its graphs per
thread) and every forward launched without waiting runs on one thread of its own,
`ladder-forwards`, and the worker goes on; `launched()` waits until the one handed over has run.
Forwards run one at a time, in the order asked (docs/architecture-cuda.md, How the host waits).
With a `ReplayWait` (`--cuda-wait replay`) the host sleeps through each captured forward's wait
and spins in every other.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import onnxruntime as ort

from engine.runtime.cuda_runtime import ReplayWait

EAGER = -1  # onnxruntime's gpu_graph_id for "run without capture or replay"


class Forwards:
    def __init__(
        self, session: Any, graphs: bool, replay_thread: bool, replay_wait: ReplayWait | None = None
    ) -> None:
        self.session = session
        self.graphs = graphs
        self.replay_wait = replay_wait
        self._options: dict[tuple[int, bool], Any] = {}
        self._runner = ThreadPoolExecutor(1, thread_name_prefix="ladder-forwards") if replay_thread else None
        self._launch: Future[None] | None = None

    def options(self, graph_id: int, wait: bool) -> Any:
        """The run options of a forward of graph `graph_id`: without `wait`, onnxruntime's
        end-of-run sync is off (a replay still waits for its forward)."""
        options = self._options.get((graph_id, wait))
        if options is None:
            options = self._options[(graph_id, wait)] = ort.RunOptions()
            if self.graphs:
                options.add_run_config_entry("gpu_graph_id", str(graph_id))
            if not wait:
                options.add_run_config_entry("disable_synchronize_execution_providers", "1")
        return options

    def run(self, binding: Any, graph_id: int, wait: bool) -> None:
        """One forward of `binding`. On the runner (`replay_thread`) when it is a captured graph's
        or is not waited for; returns once it ran when `wait`, else at once."""
        options = self.options(graph_id, wait)
        self.launched()  # one forward at a time, in the order asked
        captured = self.graphs and graph_id != EAGER
        run = self._slept if captured and self.replay_wait is not None else self.session.run_with_iobinding
        if self._runner is None or (wait and graph_id == EAGER):
            run(binding, options)
            return
        launch = self._runner.submit(run, binding, options)
        if wait:
            launch.result()
        else:
            self._launch = launch

    def _slept(self, binding: Any, options: Any) -> None:
        """A captured forward with the host asleep in its replay's wait (`replay_wait`)."""
        assert self.replay_wait is not None
        self.replay_wait.sleep()
        try:
            self.session.run_with_iobinding(binding, options)
        finally:
            self.replay_wait.spin()

    def launched(self) -> None:
        """Wait until the forward handed to the runner without waiting has run, raising its error
        (once)."""
        launch, self._launch = self._launch, None
        if launch is not None:
            launch.result()

    @property
    def pending(self) -> bool:
        """Whether a forward handed to the runner may not have run yet."""
        return self._launch is not None
