"""A long prefill interleaves with a running decode: the stream never waits more than ~one chunk forward."""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

import pytest

from engine.executor import Engine, EngineOptions
from tests.service.conftest import (
    RunningServer,
    greedy_request,
    model_with_tokenizer,
    prompt_ids,
    server_config,
)

LONG_PROMPT = 960  # fifteen chunk forwards at chunk 64


@pytest.fixture(scope="module")
def big_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Big enough that a chunk forward costs clearly more than a decode step.
    return model_with_tokenizer(tmp_path_factory.mktemp("big"), hidden_size=512, intermediate_size=2048,
                                num_layers=6, num_heads=16, num_kv_heads=4, head_size=32)


def chunk_forward_seconds(model_dir: Path, tokens: list[int]) -> float:
    """A chunk forward at the longest pasts of this prompt, measured on the engine itself (warm)."""
    engine = Engine.load(model_dir, EngineOptions())
    session = engine.open_session()
    times = []
    for _ in range(2):
        session.rewind_to(0)
        times.clear()
        start = time.perf_counter()
        for _report in session.prefill(tokens):
            times.append(time.perf_counter() - start)
            start = time.perf_counter()
    return statistics.median(times[-5:])  # the later chunks attend over more past: the dearest


def test_a_long_prefill_never_stalls_a_running_stream_for_two_chunk_forwards(big_model: Path) -> None:
    long_prompt = prompt_ids(LONG_PROMPT, seed=30)
    chunk = chunk_forward_seconds(big_model, long_prompt)
    running = RunningServer(server_config(big_model, max_new_tokens=1000))
    try:
        arrivals: list[float] = []
        stream = running.stub.GenerateStream(greedy_request(prompt_ids(8, seed=31), 400))
        for _event in stream:
            arrivals.append(time.perf_counter())
            if len(arrivals) == 20:
                break
        window: list[float] = []

        def long_request() -> None:
            window.append(time.perf_counter())
            running.stub.Generate(greedy_request(long_prompt, 1))
            window.append(time.perf_counter())

        worker = threading.Thread(target=long_request)
        worker.start()
        for event in stream:
            arrivals.append(time.perf_counter())
            if event.HasField("done") or (len(window) == 2 and arrivals[-1] > window[1] + 0.05):
                break
        worker.join()
        stream.cancel()
    finally:
        running.close()
    pairs = zip(arrivals, arrivals[1:], strict=False)
    during = [b - a for a, b in pairs if window[0] <= a and b <= window[1]]
    prefill_seconds = window[1] - window[0]
    assert prefill_seconds > 5 * chunk, "the long prefill took several chunk forwards"
    assert len(during) >= 5, "the stream kept producing tokens while the long prompt was prefilled"
    # One scheduling hiccup of the machine is forgiven; a stall for the whole prefill is not.
    largest, second = sorted(during)[-1], sorted(during)[-2]
    assert second < 2 * chunk, (second, chunk, statistics.median(during))
    assert largest < 4 * chunk < prefill_seconds / 2, (largest, chunk, prefill_seconds)
