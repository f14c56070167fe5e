"""The CUDA backend's bookkeeping, run on the host: numpy buffers, CPU provider, no graphs.

Swaps between sessions, rewinds, eager fallbacks and the token fast path are
the same code on both; only the array module and the provider differ.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.executor import Engine, EngineOptions
from engine.executor.cpu import CpuBackend
from engine.executor.cuda import CudaBackend, host_runtime
from engine.executor.engine import make_backend
from engine.executor.sampling import Sampler, SamplingParams
from engine.model import load_model_info
from engine.modelgen.synthetic import TINY, build_synthetic

GREEDY = Sampler(SamplingParams())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_synthetic(TINY, tmp_path_factory.mktemp("models"))


def resident_engine(path: Path, **overrides: object) -> Engine:
    options = EngineOptions(capacity=512, **overrides)  # type: ignore[arg-type]
    info = load_model_info(path)
    return Engine(info, options, CudaBackend(info, options, host_runtime()))


def cpu_engine(path: Path, **overrides: object) -> Engine:
    options = EngineOptions(capacity=512, **overrides)  # type: ignore[arg-type]
    info = load_model_info(path)
    return Engine(info, options, CpuBackend(info, options))


def prompt(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(3, TINY.vocab_size, n).tolist()


def generate(engine: Engine, tokens: list[int], new: int) -> list[int]:
    session = engine.open_session()
    out = [session.next_token(GREEDY, tokens)]
    for _ in range(new - 1):
        out.append(session.next_token(GREEDY, [out[-1]]))
    session.close()
    return out


def test_next_token_is_the_argmax_of_the_appended_logits(model_dir: Path) -> None:
    engine = cpu_engine(model_dir)
    a, b = engine.open_session(), engine.open_session()
    tokens = prompt(150)
    assert a.next_token(GREEDY, tokens) == int(np.argmax(b.append(tokens)))


def test_resident_backend_matches_the_cpu_backend_token_for_token(model_dir: Path) -> None:
    for n in (5, 70, 150):
        assert generate(resident_engine(model_dir), prompt(n, n), 12) == \
            generate(cpu_engine(model_dir), prompt(n, n), 12)


def test_interleaved_sessions_swap_their_kv_and_keep_their_tokens(model_dir: Path) -> None:
    alone = [generate(cpu_engine(model_dir), prompt(n, n), 10) for n in (90, 33)]
    engine = resident_engine(model_dir)
    sessions = [engine.open_session(), engine.open_session()]
    outs = [[s.next_token(GREEDY, prompt(n, n))] for s, n in zip(sessions, (90, 33), strict=True)]
    for _ in range(9):
        for s, out in zip(sessions, outs, strict=True):
            out.append(s.next_token(GREEDY, [out[-1]]))
    assert outs == alone
    assert engine.backend.home.swaps >= 18


def test_a_parked_session_rewinds_and_resumes_exactly(model_dir: Path) -> None:
    engine = resident_engine(model_dir)
    a, b = engine.open_session(), engine.open_session()
    first = a.next_token(GREEDY, prompt(80))
    b.next_token(GREEDY, prompt(40, 1))  # a is parked now
    a.next_token(GREEDY, [first])
    a.rewind_to(80)
    b.next_token(GREEDY, [7])
    assert a.next_token(GREEDY, [first]) == generate(cpu_engine(model_dir), prompt(80), 2)[1]


def test_widths_the_cache_will_not_keep_run_eagerly_with_the_same_tokens(model_dir: Path) -> None:
    engine = resident_engine(model_dir, padding=False)
    outs = [generate(engine, prompt(n, n), 3) for n in (20, 30, 45, 50, 55)]
    stats = engine.stats()
    assert stats.variants.refusals > 0 and stats.eager_forwards == stats.variants.refusals
    assert outs == [generate(cpu_engine(model_dir, padding=False), prompt(n, n), 3)
                    for n in (20, 30, 45, 50, 55)]


def test_repetition_penalty_on_the_backend_matches_the_host_sampler(model_dir: Path) -> None:
    sampler = Sampler(SamplingParams(repetition_penalty=1.8))
    device, host = resident_engine(model_dir).open_session(), cpu_engine(model_dir).open_session()
    tokens = prompt(60)
    assert device.next_token(sampler, tokens) == host.next_token(sampler, tokens)


def test_cuda_falls_back_to_cpu_when_the_provider_is_missing(model_dir: Path) -> None:
    pytest.importorskip("onnxruntime")
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("a CUDA provider is installed here")
    backend = make_backend(load_model_info(model_dir), EngineOptions(provider="cuda"))
    assert backend.name == "cpu"


def lookahead_engine(path: Path, **overrides: object) -> Engine:
    engine = resident_engine(path, **overrides)
    engine.backend.lookahead = True
    return engine


def test_lookahead_decode_gives_the_same_tokens_and_hits_every_loop_step(model_dir: Path) -> None:
    engine = lookahead_engine(model_dir)
    assert generate(engine, prompt(70, 70), 20) == generate(cpu_engine(model_dir), prompt(70, 70), 20)
    assert engine.backend.lookahead_hits >= 17 and engine.backend.lookahead_misses == 0


def test_a_dropped_lookahead_leaves_no_trace(model_dir: Path) -> None:
    engine, cpu = lookahead_engine(model_dir), cpu_engine(model_dir)
    a, b = engine.open_session(), cpu.open_session()
    tokens = [a.next_token(GREEDY, prompt(50))]
    assert tokens == [b.next_token(GREEDY, prompt(50))]
    for _ in range(4):
        tokens.append(a.next_token(GREEDY, [tokens[-1]]))
        b.next_token(GREEDY, [tokens[-2]])
    # Feed a different token than the one looked ahead, then rewind over it and resume.
    assert a.next_token(GREEDY, [11]) == b.next_token(GREEDY, [11])
    a.rewind_to(52)
    b.rewind_to(52)
    assert a.next_token(GREEDY, [5, 6, 7]) == b.next_token(GREEDY, [5, 6, 7])
    assert engine.backend.lookahead_misses >= 1


def test_interleaved_sessions_never_look_ahead(model_dir: Path) -> None:
    engine = lookahead_engine(model_dir)
    sessions = [engine.open_session(), engine.open_session()]
    outs = [[s.next_token(GREEDY, prompt(n, n))] for s, n in zip(sessions, (90, 33), strict=True)]
    for _ in range(6):
        for s, out in zip(sessions, outs, strict=True):
            out.append(s.next_token(GREEDY, [out[-1]]))
    assert outs == [generate(cpu_engine(model_dir), prompt(n, n), 7) for n in (90, 33)]
    assert engine.backend.lookahead_hits == engine.backend.lookahead_misses == 0
