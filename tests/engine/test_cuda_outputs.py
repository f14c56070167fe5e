"""Log-probabilities, penalties and copied sessions on a real device (run on the H200; CI deselects `gpu`).

The CUDA backend computes log-probabilities where the logits live and applies
presence/frequency penalties there; an fp16 decoder on CUDA gives the CPU
path's greedy tokens and log-probabilities within fp16 noise, and a session
copied into another slot (n samples) decodes exactly as the one it copies.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.executor import DecodeRow, EngineOptions
from engine.executor.engine import Engine
from engine.sampling import Sampler, SamplingParams, TokenLogprobs
from tests.support.models import CUDA_SPEC, cuda_model

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cuda_model(tmp_path_factory.mktemp("models"))


def engine_on(path: Path, provider: str) -> Engine:
    return Engine.load(path, EngineOptions(provider=provider, capacity=2048, max_sessions=4))


def prompt(n: int) -> list[int]:
    return np.random.default_rng(n).integers(3, CUDA_SPEC.vocab_size, n).tolist()


def run(
    engine: Engine, tokens: list[int], sampler: Sampler, new: int = 12
) -> tuple[list[int], list[TokenLogprobs]]:
    session = engine.open_session()
    task = engine.start_prefill(session, tokens, logprob_top=5)
    while not task.done:
        engine.prefill_step(task)
    out = [engine.choose(session, sampler)]
    found = [sampler.last]
    for _ in range(new - 1):
        out.append(engine.decode([DecodeRow(session, out[-1], sampler)])[0])  # type: ignore[arg-type]
        found.append(sampler.last)
    engine.close_session(session)
    return out, [*task.logprobs, *(f for f in found if f is not None)]


@pytest.mark.parametrize(
    "params", [SamplingParams(), SamplingParams(presence_penalty=2.0, frequency_penalty=1.0)]
)
def test_the_device_gives_the_cpu_paths_tokens_and_logprobs(model_dir: Path, params: SamplingParams) -> None:
    tokens = prompt(300)
    device_tokens, device = run(engine_on(model_dir, "cuda"), tokens, Sampler(params, top_logprobs=5))
    host_tokens, host = run(engine_on(model_dir, "cpu"), tokens, Sampler(params, top_logprobs=5))
    assert device_tokens == host_tokens
    assert len(device) == len(host) == 299 + 12
    np.testing.assert_allclose([p.logprob for p in device], [p.logprob for p in host], atol=0.05)
    agree = np.mean([d.top[0][0] == h.top[0][0] for d, h in zip(device, host, strict=True)])
    assert agree > 0.95


def test_a_copied_session_decodes_as_the_one_it_copies(model_dir: Path) -> None:
    engine = engine_on(model_dir, "cuda")
    greedy = Sampler(SamplingParams())
    source, copy = engine.open_session(), engine.open_session()
    engine.append(source, prompt(200))
    engine.copy_session(source, copy)
    last = [engine.choose(source, greedy), engine.choose(copy, greedy)]
    outs: list[list[int]] = [[last[0]], [last[1]]]
    for _ in range(10):
        chosen = engine.decode([DecodeRow(source, last[0], greedy), DecodeRow(copy, last[1], greedy)])
        last = [int(t) for t in chosen if t is not None]
        outs[0].append(last[0])
        outs[1].append(last[1])
    assert outs[0] == outs[1]
