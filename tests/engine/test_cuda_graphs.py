"""CUDA graph variants on a real device (run on the H200; CI deselects `gpu`).

Graph replays must give the same greedy tokens as eager runs, as the CPU
path, and follow the CPU path's plan; captures stay within the variant cache
(the prefill ladder and the decode batch widths).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.executor import DecodeRow, EngineOptions
from engine.executor.engine import Engine
from engine.model import load_model_info
from engine.sampling import Sampler, SamplingParams
from tests.support.models import CUDA_SPEC, cuda_model

pytestmark = pytest.mark.gpu
GREEDY = Sampler(SamplingParams())
LENGTHS = (7, 40, 200, 333, 700)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cuda_model(tmp_path_factory.mktemp("models"))


def engine_on(path: Path, provider: str, *, graphs: bool = True, **overrides: object) -> Engine:
    options = EngineOptions(provider=provider, capacity=2048, **overrides)  # type: ignore[arg-type]
    if provider == "cpu" or graphs:
        return Engine.load(path, options)
    from engine.runtime.cuda import CudaBackend, cuda_runtime

    info = load_model_info(path)
    return Engine(info, options, CudaBackend(info, options, cuda_runtime(options, graphs=False)))


def generate(engine: Engine, n: int, new: int = 16) -> tuple[list[int], tuple[int, ...]]:
    session = engine.open_session()
    tokens = np.random.default_rng(n).integers(3, CUDA_SPEC.vocab_size, n).tolist()
    widths = engine.plan(session, n).widths
    engine.append(session, tokens)
    out = [engine.choose(session, GREEDY)]
    for _ in range(new - 1):
        out.append(engine.decode([DecodeRow(session, out[-1], GREEDY)])[0])
    engine.close_session(session)
    return out, widths


def test_the_cuda_backend_is_selected_on_a_gpu(model_dir: Path) -> None:
    assert engine_on(model_dir, "cuda").backend.name == "cuda"


def test_a_host_that_sleeps_on_the_device_gets_the_tokens_of_one_that_spins(model_dir: Path) -> None:
    expected = [generate(engine_on(model_dir, "cuda"), n) for n in LENGTHS[:3]]
    blocking = engine_on(model_dir, "cuda", cuda_wait="block")
    assert blocking.backend.rt.blocking  # type: ignore[attr-defined]
    assert [generate(blocking, n) for n in LENGTHS[:3]] == expected


def test_a_host_that_sleeps_only_in_replays_gets_the_tokens_of_one_that_spins(model_dir: Path) -> None:
    expected = [generate(engine_on(model_dir, "cuda"), n) for n in LENGTHS[:3]]
    replay = engine_on(model_dir, "cuda", cuda_wait="replay")
    assert replay.backend.rt.replay_wait is not None  # type: ignore[attr-defined]  # a CUDA 12.1+ driver
    assert [generate(replay, n) for n in LENGTHS[:3]] == expected


def test_graph_replays_give_the_greedy_tokens_of_eager_runs(model_dir: Path) -> None:
    graphs, eager = engine_on(model_dir, "cuda"), engine_on(model_dir, "cuda", graphs=False)
    for _ in range(2):  # the second pass replays every captured graph
        for n in LENGTHS:
            assert generate(graphs, n) == generate(eager, n)
    held = graphs.stats().variants.entries
    assert graphs.backend.captures == len(held) <= graphs.variants.capacity
    assert all(e.nbytes > 0 for e in held)


def test_graph_replays_follow_the_cpu_plan_and_its_greedy_tokens(model_dir: Path) -> None:
    cuda, cpu = engine_on(model_dir, "cuda"), engine_on(model_dir, "cpu")
    for n in LENGTHS:
        (cuda_tokens, cuda_widths), (cpu_tokens, cpu_widths) = generate(cuda, n), generate(cpu, n)
        assert cuda_widths == cpu_widths
        assert cuda_tokens == cpu_tokens


def test_sessions_decoded_together_in_one_graph_give_their_tokens_alone(model_dir: Path) -> None:
    alone = [generate(engine_on(model_dir, "cuda"), n)[0] for n in LENGTHS]
    engine = engine_on(model_dir, "cuda")
    sessions = [engine.open_session() for _ in LENGTHS]
    for session, n in zip(sessions, LENGTHS, strict=True):
        engine.append(session, np.random.default_rng(n).integers(3, CUDA_SPEC.vocab_size, n).tolist())
    outs = [[engine.choose(s, GREEDY)] for s in sessions]
    for _ in range(15):
        chosen = engine.decode([DecodeRow(s, o[-1], GREEDY) for s, o in zip(sessions, outs, strict=True)])
        for out, token in zip(outs, chosen, strict=True):
            out.append(token)
    assert outs == alone
    assert engine.stats().decode.widths == ((8, 15),)
    assert engine.stats().decode.chained >= 12  # the device chose and launched ahead (decode.py's chain)


@pytest.mark.parametrize(
    "replay_thread", [False, True], ids=["forwards on the worker", "forwards on a runner"]
)
def test_chained_decode_gives_step_by_step_tokens_as_rows_leave_and_join(
    model_dir: Path, replay_thread: bool
) -> None:
    def run(engine: Engine) -> list[list[int]]:
        sessions = [engine.open_session() for _ in LENGTHS]
        for session, n in zip(sessions, LENGTHS, strict=True):
            engine.append(session, np.random.default_rng(n).integers(3, CUDA_SPEC.vocab_size, n).tolist())
        outs = [[engine.choose(s, GREEDY)] for s in sessions]
        active = list(range(len(sessions)))
        for step in range(30):
            if step == 10:  # one leaves: the forward chained ahead is dropped
                engine.close_session(sessions[2])
                active.remove(2)
            if step == 18:  # one joins, in the freed row
                sessions[2] = engine.open_session()
                engine.append(sessions[2], list(range(5, 60)))
                outs[2].append(engine.choose(sessions[2], GREEDY))
                active.append(2)
            rows = [DecodeRow(sessions[i], outs[i][-1], GREEDY) for i in active]
            for i, token in zip(active, engine.decode(rows), strict=True):
                outs[i].append(token)  # type: ignore[arg-type]
        return outs

    chained = engine_on(model_dir, "cuda", replay_thread=replay_thread)
    assert run(chained) == run(engine_on(model_dir, "cuda", lookahead=False))
    assert chained.stats().decode.chained >= 20


def test_padding_off_runs_uncached_widths_eagerly_without_new_captures(model_dir: Path) -> None:
    engine = engine_on(model_dir, "cuda", padding=False)
    for n in (300, 310, 320, 330, 340, 350, 360, 370, 380):
        generate(engine, n, 2)
    assert engine.backend.captures <= engine.variants.capacity and engine.eager_forwards > 0


def test_captured_prefill_forwards_run_the_head_on_the_last_real_row_only(model_dir: Path) -> None:
    engine = engine_on(model_dir, "cuda")
    forwards: list[tuple[int, int, int, list[int]]] = []
    run_rows = engine.backend.run_rows

    def recorded(variant, key, row, past, feed, ports, constants, read):  # type: ignore[no-untyped-def]
        out = run_rows(variant, key, row, past, feed, ports, constants, read)
        assert out.seen is not None
        forwards.append((int(read[-1]) + 1, key.width, out.logits.shape[1], out.seen.tolist()))
        return out

    engine.backend.run_rows = recorded  # type: ignore[method-assign]
    for _ in range(2):  # the second pass replays the captured prefill graphs
        for n in LENGTHS:
            generate(engine, n)
    assert engine.info.logits_rows and engine.backend.captures > 0
    assert any(width > rows for rows, width, _, _ in forwards), "the prompts include padded forwards"
    for rows, width, logits_rows, seen in forwards:
        assert logits_rows == 1 and seen == [rows - 1, width - 1]


def _seeded(i: int) -> Sampler:
    """Session i's sampler: seeded top-p sampling for most, greedy for every third."""
    if i % 3 == 2:
        return Sampler(SamplingParams())
    return Sampler(SamplingParams(temperature=0.8, top_p=0.95, seed=100 + i))


def test_chained_sampled_decode_gives_the_step_by_step_tokens_as_rows_leave_and_join(model_dir: Path) -> None:
    def run(engine: Engine) -> list[list[int]]:
        sessions = [engine.open_session() for _ in LENGTHS]
        samplers = [_seeded(i) for i in range(len(LENGTHS))]
        for session, n in zip(sessions, LENGTHS, strict=True):
            engine.append(session, np.random.default_rng(n).integers(3, CUDA_SPEC.vocab_size, n).tolist())
        outs = [[engine.choose(s, samplers[i])] for i, s in enumerate(sessions)]
        active = list(range(len(sessions)))
        for step in range(30):
            if step == 10:
                engine.close_session(sessions[1])
                active.remove(1)
            if step == 18:
                sessions[1] = engine.open_session()
                engine.append(sessions[1], list(range(5, 60)))
                outs[1].append(engine.choose(sessions[1], samplers[1]))
                active.append(1)
            rows = [DecodeRow(sessions[i], outs[i][-1], samplers[i]) for i in active]
            for i, token in zip(active, engine.decode(rows), strict=True):
                outs[i].append(token)  # type: ignore[arg-type]
        return outs

    chained = engine_on(model_dir, "cuda")
    outs = run(chained)
    assert outs == run(engine_on(model_dir, "cuda", lookahead=False))
    assert chained.stats().decode.chained >= 20  # sampled rows chained too
    greedy = [generate(engine_on(model_dir, "cuda"), n, 31)[0] for n in LENGTHS[:1]]
    assert outs[0] != greedy[0], "the sampler really samples"


def test_a_seeded_session_draws_the_same_tokens_alone_beside_63_others_and_beside_different_ones(
    model_dir: Path,
) -> None:
    def tokens_of(engine: Engine, others: list[tuple[int, Sampler]]) -> list[int]:
        mine = engine.open_session()
        engine.append(mine, np.random.default_rng(1).integers(3, CUDA_SPEC.vocab_size, 50).tolist())
        sampler = Sampler(SamplingParams(temperature=0.8, top_p=0.95, seed=42))
        rest = [engine.open_session() for _ in others]
        for session, (n, _) in zip(rest, others, strict=True):
            engine.append(session, np.random.default_rng(n).integers(3, CUDA_SPEC.vocab_size, n).tolist())
        out = [engine.choose(mine, sampler)]
        theirs = [[engine.choose(s, o)] for s, (_, o) in zip(rest, others, strict=True)]
        for _ in range(20):
            rows = [DecodeRow(mine, out[-1], sampler)]
            rows += [DecodeRow(s, t[-1], o) for s, t, (_, o) in zip(rest, theirs, others, strict=True)]
            chosen = engine.decode(rows)
            out.append(chosen[0])  # type: ignore[arg-type]
            for t, token in zip(theirs, chosen[1:], strict=True):
                t.append(token)  # type: ignore[arg-type]
        for session in (mine, *rest):
            engine.close_session(session, keep=False)
        return out

    engine = engine_on(model_dir, "cuda", max_sessions=64)
    alone = tokens_of(engine, [])
    beside = tokens_of(engine, [(10 + i, _seeded(i)) for i in range(63)])
    different = tokens_of(
        engine, [(300 + i, Sampler(SamplingParams(temperature=1.5, top_k=5, seed=i))) for i in range(9)]
    )
    assert alone == beside == different
