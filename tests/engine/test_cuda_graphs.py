"""CUDA graph variants on a real device (run on the H200; CI deselects `gpu`).

Graph replays must give the same greedy tokens as eager runs, as the CPU
path, and follow the CPU path's plan; captures stay within the four variants.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from engine.executor import Engine, EngineOptions
from engine.executor.sampling import Sampler, SamplingParams
from engine.model import load_model_info
from engine.modelgen.synthetic import TINY, build_synthetic

pytestmark = pytest.mark.gpu
GREEDY = Sampler(SamplingParams())
SPEC = replace(TINY, dtype="float16", vocab_size=4096, hidden_size=512, intermediate_size=1408,
               num_layers=4, num_heads=8, num_kv_heads=2, head_size=64, rotary_rows=2048)
LENGTHS = (7, 40, 200, 333, 700)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_synthetic(SPEC, tmp_path_factory.mktemp("models"), chunk_size=256,
                           context_length=2048)


def engine_on(path: Path, provider: str, *, graphs: bool = True, **overrides: object) -> Engine:
    options = EngineOptions(provider=provider, capacity=2048, **overrides)  # type: ignore[arg-type]
    if provider == "cpu" or graphs:
        return Engine.load(path, options)
    from engine.executor.cuda import CudaBackend, cuda_runtime

    info = load_model_info(path)
    return Engine(info, options, CudaBackend(info, options, cuda_runtime(options, graphs=False)))


def generate(engine: Engine, n: int, new: int = 16) -> tuple[list[int], tuple[int, ...]]:
    session = engine.open_session()
    tokens = np.random.default_rng(n).integers(3, SPEC.vocab_size, n).tolist()
    widths = session.plan(n).widths
    out = [session.next_token(GREEDY, tokens)]
    for _ in range(new - 1):
        out.append(session.next_token(GREEDY, [out[-1]]))
    session.close()
    return out, widths


def test_the_cuda_backend_is_selected_on_a_gpu(model_dir: Path) -> None:
    assert engine_on(model_dir, "cuda").backend.name == "cuda"


def test_graph_replays_give_the_greedy_tokens_of_eager_runs(model_dir: Path) -> None:
    graphs, eager = engine_on(model_dir, "cuda"), engine_on(model_dir, "cuda", graphs=False)
    for _ in range(2):  # the second pass replays every captured graph
        for n in LENGTHS:
            assert generate(graphs, n) == generate(eager, n)
    assert graphs.backend.captures == len(graphs.stats().variants.entries) <= 4
    assert all(e.nbytes > 0 for e in graphs.stats().variants.entries)


def test_graph_replays_follow_the_cpu_plan_and_its_greedy_tokens(model_dir: Path) -> None:
    cuda, cpu = engine_on(model_dir, "cuda"), engine_on(model_dir, "cpu")
    for n in LENGTHS:
        (cuda_tokens, cuda_widths), (cpu_tokens, cpu_widths) = generate(cuda, n), generate(cpu, n)
        assert cuda_widths == cpu_widths
        assert cuda_tokens == cpu_tokens


def test_interleaved_sessions_replay_graphs_on_swapped_kv(model_dir: Path) -> None:
    alone = [generate(engine_on(model_dir, "cuda"), n)[0] for n in (200, 40)]
    engine = engine_on(model_dir, "cuda")
    sessions = [engine.open_session() for _ in range(2)]
    prompts = [np.random.default_rng(n).integers(3, SPEC.vocab_size, n).tolist() for n in (200, 40)]
    outs = [[s.next_token(GREEDY, p)] for s, p in zip(sessions, prompts, strict=True)]
    for _ in range(15):
        for s, out in zip(sessions, outs, strict=True):
            out.append(s.next_token(GREEDY, [out[-1]]))
    assert outs == alone


def test_padding_off_runs_uncached_widths_eagerly_without_new_captures(model_dir: Path) -> None:
    engine = engine_on(model_dir, "cuda", padding=False)
    for n in (300, 310, 320, 330, 340, 350):
        generate(engine, n, 2)
    assert engine.backend.captures <= 4 and engine.eager_forwards > 0


def test_lookahead_decode_gives_the_tokens_of_step_by_step_decode(model_dir: Path) -> None:
    ahead, stepwise = engine_on(model_dir, "cuda"), engine_on(model_dir, "cuda")
    stepwise.backend.lookahead = False
    for n in LENGTHS:
        assert generate(ahead, n, 40) == generate(stepwise, n, 40)
    assert ahead.backend.lookahead_hits > 0 and stepwise.backend.lookahead_hits == 0
