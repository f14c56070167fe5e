"""Sampled rows drawn on the host's cores at once (the CPU backend's choice of a step's tokens).

Between two forwards onnxruntime's threads are idle, and a step's choices ran on one of the
machine's cores: 8 sampled rows of a 49k vocabulary cost ~12 ms a step on one core. A row's draw is
numpy over the whole row (scaling, exp, partition, sort, running sums), which releases the GIL, so
rows drawn on several threads run on several cores. Only plain sampled rows are spread (no
constraint, penalty or log-probabilities: `Sampler.plain`): their choice reads nothing but the
row, the parameters and the key, and writes nothing shared (engine.sampling's scratch buffers are
per thread). Every other row is chosen on the calling thread as before. The tokens are the same
however the rows are spread: each depends on its own row and position only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from engine.sampling import Sampler


def host_cores(configured: int = 0) -> int:
    """The cores draws may use: onnxruntime's intra-op threads when set, else this process's CPUs."""
    if configured > 0:
        return configured
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def spread(samplers: Sequence[Sampler]) -> list[int]:
    """The rows whose draws may run on any thread: plain and sampled (a greedy row's argmax costs
    less than handing it to a thread)."""
    return [i for i, s in enumerate(samplers) if s.plain and not s.params.greedy]


class HostDraws:
    """Chooses a step's tokens from host logits, the plain sampled rows split over `cores` threads
    (the calling one and cores - 1 workers, started on first use)."""

    def __init__(self, cores: int) -> None:
        self.cores = max(1, cores)
        self._workers: ThreadPoolExecutor | None = None

    def choose(
        self,
        logits: Callable[[int], np.ndarray],
        samplers: Sequence[Sampler],
        histories: Sequence[Sequence[int]],
    ) -> list[int]:
        """One token per row i, from logits(i), by samplers[i] with histories[i]."""
        tokens = [0] * len(samplers)

        def run(rows: Sequence[int]) -> None:
            for i in rows:
                tokens[i] = samplers[i](logits(i), histories[i])

        shared = spread(samplers) if self.cores > 1 else []
        if len(shared) < 2:
            run(range(len(samplers)))
            return tokens
        parts = [shared[k :: self.cores] for k in range(self.cores)]
        if self._workers is None:
            self._workers = ThreadPoolExecutor(self.cores - 1, thread_name_prefix="ladder-draws")
        pending = [self._workers.submit(run, part) for part in parts[1:] if part]
        taken = set(shared)
        run([i for i in range(len(samplers)) if i not in taken] + parts[0])
        for future in pending:
            future.result()
        return tokens
