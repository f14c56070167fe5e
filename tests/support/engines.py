"""Engines on generated models, and the greedy references the tests compare servers and paths against."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from engine.executor import DecodeRow, EngineOptions, Session
from engine.executor.engine import Engine
from engine.sampling import Sampler, SamplingParams

# Intra-op threads for each onnxruntime session a test makes: the machine's cores shared among
# pytest-xdist's workers (set once at start-up by the harness; 0 = onnxruntime's own default, as
# in one process). Two workers on two cores with a pool each would run four busy threads on two.
INTRA_OP_THREADS = 0


def cores_per_worker(cores: int, workers: int) -> int:
    """Each worker's share of `cores` (at least one); 0 (onnxruntime's default) without workers."""
    return 0 if workers <= 1 else max(1, cores // workers)


def host_device_engine(path: Path, **overrides: object) -> Engine:
    """The CUDA backend's code on the host (numpy buffers, CPU provider), capacity 512."""
    from engine.model import load_model_info
    from engine.runtime.cuda import CudaBackend, host_runtime

    options = EngineOptions(capacity=512, **overrides)  # type: ignore[arg-type]
    info = load_model_info(path)
    return Engine(info, options, CudaBackend(info, options, host_runtime()))


def load(path: Path, **options: object) -> Engine:
    """Engine.load with `options` (each an EngineOptions field); this worker's share of the cores
    unless `intra_op_threads` is given."""
    options.setdefault("intra_op_threads", INTRA_OP_THREADS)
    return Engine.load(path, EngineOptions(**options))  # type: ignore[arg-type]


def cpu_session(model: str | bytes) -> ort.InferenceSession:
    """A plain onnxruntime CPU session on `model` (a path or the bytes of one), with this worker's
    share of the cores."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = INTRA_OP_THREADS
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def load_default(model_dir: Path, **options: object) -> Engine:
    """An engine on a converted default model (`<cache>/models/<name>`). Its rewritten graph is kept
    in `<cache>/graphs`, where the server keeps it under its model cache, so each conversion's
    graph is rewritten once, not once per test process (a rewrite of the fp32 model is ~6 s)."""
    return load(model_dir, graph_cache=model_dir.parents[1] / "graphs", **options)


def greedy(
    engine: Engine, session: Session, steps: int, tokens: Sequence[int] | None = None, feed_last: bool = True
) -> list[int]:
    """Append `tokens` (if given), then continue greedily for `steps` tokens, one decode step each.

    Every chosen token is fed back, the last one included unless `feed_last` is False, so the
    session ends holding all of them (a next turn appends after the whole continuation).
    """
    if tokens is not None:
        engine.append(session, tokens)
    sampler = Sampler(SamplingParams())
    out = [engine.choose(session, sampler)]
    while len(out) < steps:
        chosen = engine.decode([DecodeRow(session, out[-1], sampler)])[0]
        assert chosen is not None
        out.append(chosen)
    if feed_last:
        engine.decode([DecodeRow(session, out[-1])])
    return out


def greedy_from_prompt(engine: Engine, tokens: list[int], steps: int) -> list[int]:
    """Greedy continuation of `tokens` on a session of its own, returned to the pool after."""
    session = engine.open_session()
    try:
        return greedy(engine, session, steps, tokens)
    finally:
        engine.close_session(session)


def greedy_by_appending(engine: Engine, tokens: list[int], steps: int) -> list[int]:
    """The argmax continuation computed the plainest way: each token appended as a whole forward
    (no decode step, no sampler), on a session of its own."""
    session = engine.open_session()
    try:
        logits, out = engine.append(session, tokens), []
        for _ in range(steps):
            out.append(int(np.argmax(logits)))
            logits = engine.append(session, [out[-1]])
        return out
    finally:
        engine.close_session(session)
