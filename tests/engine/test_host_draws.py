"""The CPU backend draws a step's plain sampled rows on several threads (engine.runtime.host_draws):
the tokens are those of one thread, row by row, whatever the number of threads, and the rows that
are not plain (penalized, constrained, asking for log-probabilities) or greedy stay on the caller."""

from __future__ import annotations

import threading

import numpy as np

from engine.runtime.host_draws import HostDraws, host_cores, spread
from engine.sampling import Sampler, SamplingParams


def _samplers() -> list[Sampler]:
    kinds = [
        SamplingParams(temperature=0.8, top_p=0.95, seed=1),
        SamplingParams(),
        SamplingParams(temperature=1.0, top_k=40, min_p=0.05, seed=2),
        SamplingParams(temperature=0.7, top_p=0.9, repetition_penalty=1.2, seed=3),
        SamplingParams(temperature=1.3, seed=None),
    ]
    samplers = [Sampler(kinds[i % len(kinds)]) for i in range(13)]
    samplers[6] = Sampler(SamplingParams(temperature=0.9, seed=4), top_logprobs=2)
    return samplers


def test_a_step_s_tokens_are_the_same_on_one_thread_and_on_several() -> None:
    rng = np.random.default_rng(0)
    store = (rng.standard_normal((13, 4096)) * rng.uniform(0.5, 4.0, (13, 1))).astype(np.float32)
    samplers = _samplers()
    histories = [list(range(5 + i)) for i in range(13)]
    for step in range(5):
        histories = [h + [step] for h in histories]
        alone = HostDraws(1).choose(lambda i: store[i], samplers, histories)
        for cores in (2, 3, 8):
            assert HostDraws(cores).choose(lambda i: store[i], samplers, histories) == alone, (step, cores)


def test_only_plain_sampled_rows_leave_the_calling_thread() -> None:
    samplers = _samplers()
    assert spread(samplers) == [i for i in range(13) if i % 5 in (0, 2, 4) and i != 6]
    seen: dict[int, str] = {}
    store = np.random.default_rng(1).standard_normal((13, 512)).astype(np.float32)

    def logits(i: int) -> np.ndarray:
        seen[i] = threading.current_thread().name
        return store[i]

    HostDraws(2).choose(logits, samplers, [[]] * 13)
    caller = threading.current_thread().name
    assert all(seen[i] == caller for i in (1, 3, 6, 8, 11)), seen
    assert any(name != caller for name in seen.values())


def test_draws_use_the_configured_threads_else_this_process_s_cpus() -> None:
    assert host_cores(3) == 3
    assert host_cores(0) >= 1
