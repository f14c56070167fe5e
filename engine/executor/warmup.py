"""Warm-up: every shape the engine plans (each ladder width, each batch width, each number of new
prompts sharing a prefill forward at each ladder width) prepared before any request, so no request
pays for a preparation (a graph capture on CUDA), and the backend's choosing kernels built on first
use now rather than in a request."""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from engine.executor.kernels import Sessions
from engine.options import EngineOptions
from engine.runtime.variants import VariantKey
from engine.sampling import MAX_TOP_LOGPROBS, Sampler, SamplingParams


class Warmed(Sessions, Protocol):
    """What the warm-up reads of an engine besides its sessions: the shapes it plans."""

    options: EngineOptions
    ladder: tuple[int, ...]
    capacity: int
    prompt_sizes: tuple[int, ...]
    batch_widths: tuple[int, ...]

    def warm_prompts(self, width: int, size: int) -> None: ...


def warm_up(engine: Warmed) -> int:
    """Prepare the planned shapes on a session of its own; the variants prepared."""
    info, backend = engine.info, engine.backend
    if info.supplied_ports or info.feed.name != "input_ids" or not engine.free_rows:
        return 0  # shapes depend on what callers supply: prepared as they come
    before = engine.variants.prepared
    session = engine.open_session()
    try:
        widths = [w for w in engine.ladder if w <= engine.capacity] if engine.options.padding else []
        for width in () if info.recurrent_state else widths:
            engine.append(session, [0] * width)
            engine.rewind(session, 0)
        for width in widths if engine.prompt_sizes else ():
            for size in engine.prompt_sizes:
                engine.warm_prompts(width, size)
        engine.append(session, [0])
        for batch in engine.batch_widths:
            if backend.batch_commits_rows and batch > 1:
                # Prepared, not run: onnxruntime's CPU attention commits every row a forward
                # rides along in full, so running the widest batch would commit the whole pool
                # at start (the peak a memory limit sees); a CPU variant has nothing to capture.
                engine.decoder.variant(VariantKey(1, (), batch))
                continue
            engine.decoder.forward({session.row: 0}, least=batch)
        # Choosing compiles its device kernels on first use (cupy): do it now, not in a request.
        backend.choose([session.row], [Sampler(SamplingParams())], [[]])
        backend.choose([session.row], [Sampler(SamplingParams(repetition_penalty=1.1))], [[0]])
        penalized = Sampler(SamplingParams(presence_penalty=0.1, frequency_penalty=0.1))
        penalized.chose(0)
        backend.choose([session.row], [penalized], [[0]])
        sampled = SamplingParams(temperature=0.8, top_k=50, top_p=0.9, min_p=0.01, seed=0)
        drawn = [Sampler(sampled), Sampler(replace(sampled, repetition_penalty=1.1))]
        backend.choose([session.row] * 2, drawn, [[0], [0]])
        backend.logprobs([session.row], [0], MAX_TOP_LOGPROBS)
    finally:
        engine.close_session(session, keep=False)
    for row in engine.free_rows - engine.prefixes.held.keys():  # the decode widths rode every row along
        backend.release_row(row)
    return engine.variants.prepared - before
