"""New prompts sharing a prefill forward on a real device (run on the H200; CI deselects `gpu`):
each prompt keeps the logits it gets alone, within fp16's rounding (the wider forward's GEMMs
round differently), its greedy token wherever the top two are not a near tie, and a second burst
of the same widths replays the graphs captured at warm-up."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.executor import EngineOptions
from engine.executor.engine import Engine
from engine.executor.step import Open, Prefill, Step
from engine.sampling import Sampler, SamplingParams
from tests.support.models import CUDA_SPEC, cuda_model

pytestmark = pytest.mark.gpu
GREEDY = Sampler(SamplingParams())
LENGTHS = (3, 40, 60, 85, 85, 100, 170, 256, 256, 300)  # chunk 256: rungs 86, 171, 256


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cuda_model(tmp_path_factory.mktemp("models"))


def cuda(path: Path, batch: int) -> Engine:
    options = EngineOptions(provider="cuda", capacity=2048, max_sessions=16, prefill_batch=batch)
    return Engine.load(path, options)


def prompts(seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, CUDA_SPEC.vocab_size, n).tolist() for n in LENGTHS]


def burst_logits(engine: Engine, batch: list[list[int]]) -> list[np.ndarray]:
    sessions = engine.step(Step(opens=(Open(count=len(batch)),))).opens[0].get()
    requests = [Prefill(s, tuple(p), batchable=True) for s, p in zip(sessions, batch, strict=True)]
    while requests:
        result = engine.step(Step(prefills=tuple((r, 0) for r in requests)))
        requests = [
            Prefill(r.session, task=o.get().task, batchable=True)
            for r, o in zip(requests, result.prefills, strict=True)
            if not o.get().done
        ]
    logits = [engine.logits(s) for s in sessions]
    for session in sessions:
        engine.close_session(session, keep=False)
    return logits


def test_prompts_sharing_a_forward_keep_their_logits_and_greedy_tokens_on_the_device(model_dir: Path) -> None:
    engine, single = cuda(model_dir, 8), cuda(model_dir, 1)
    engine.warm_up()
    assert engine.backend.name == "cuda" and engine.prompt_sizes == (2, 4, 8)
    captured = engine.variants.prepared
    for seed in (1, 2):
        together = burst_logits(engine, prompts(seed))
        alone = burst_logits(single, prompts(seed))
        for mine, theirs in zip(together, alone, strict=True):
            assert np.max(np.abs(mine.astype(np.float32) - theirs.astype(np.float32))) < 0.05
            top = np.sort(theirs.astype(np.float32))[-2:]
            if top[1] - top[0] > 0.1:
                assert int(np.argmax(mine)) == int(np.argmax(theirs))
    stats = engine.stats()
    assert stats.prompt_forwards >= 4 and stats.prompts_batched >= 14
    assert engine.variants.prepared == captured and stats.eager_forwards == 0
    assert single.stats().prompt_forwards == 0
