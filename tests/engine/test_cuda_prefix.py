"""Prefix reuse on a real device (run on the H200; CI deselects `gpu`): a fork's KV is a device copy,
and forked or prefix-sharing sessions give the greedy tokens of a session that prefilled everything."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.executor import EngineOptions
from engine.executor.engine import Engine
from engine.planner.restore import recompute_from
from tests.support.engines import greedy
from tests.support.models import CUDA_SPEC, cuda_model
from tests.support.prompts import common_prefix

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cuda_model(tmp_path_factory.mktemp("models"))


def cuda(path: Path, **overrides: object) -> Engine:
    return Engine.load(path, EngineOptions(provider="cuda", capacity=2048, max_sessions=4, **overrides))  # type: ignore[arg-type]


def tokens(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, CUDA_SPEC.vocab_size, n).tolist()  # type: ignore[no-any-return]


def recompute(path: Path, prompt: list[int], steps: int) -> list[int]:
    engine = cuda(path, prefix_sharing=False)
    return greedy(engine, engine.open_session(), steps, prompt)


def test_a_fork_on_the_device_decodes_as_a_session_that_prefilled_everything(model_dir: Path) -> None:
    engine = cuda(model_dir)
    assert engine.backend.name == "cuda"
    prompt = tokens(700, 1)
    source = engine.open_session()
    engine.append(source, prompt)
    full, short = engine.fork(source), engine.fork(source, 300)
    assert greedy(engine, full, 16) == recompute(model_dir, prompt, 16)
    assert greedy(engine, short, 16) == recompute(model_dir, prompt[:300], 16)
    assert greedy(engine, source, 16) == recompute(model_dir, prompt, 16)


def test_a_prompt_sharing_a_held_prefix_on_the_device_gives_the_tokens_of_a_full_prefill(
    model_dir: Path,
) -> None:
    engine = cuda(model_dir)
    system = tokens(600, 2)
    first = engine.open_session(prompt=system + tokens(50, 3))
    engine.append(first, system + tokens(50, 3))
    engine.close_session(first)
    prompt = system + tokens(80, 4)
    second = engine.open_session(prompt=prompt)
    held = common_prefix(system + tokens(50, 3), prompt)
    assert held >= 600
    # CUDA's rows follow the forward's width: the prefix is shared only where a fresh run of the
    # prompt starts a forward (engine.planner.restore), here the first chunk.
    shared = recompute_from(held, held, len(prompt), engine.chunk_size, True)
    assert second.length == shared > 0
    assert greedy(engine, second, 16, prompt[shared:]) == recompute(model_dir, prompt, 16)


def test_a_kv_copy_on_the_device_moves_exactly_the_positions_asked_and_nothing_else() -> None:
    from engine.runtime.cuda_runtime import cuda_runtime
    from engine.runtime.pool import KvPool

    rt = cuda_runtime(EngineOptions(provider="cuda"))
    xp = rt.xp
    for head_size in (64, 3):  # 128 bytes a position: the copy kernel; 6 bytes: cupy's slice assignment
        with rt.enter():
            pool = KvPool(
                xp,
                layers=3,
                rows=4,
                kv_heads=2,
                capacity=40,
                head_size=head_size,
                dtype=np.float16,
                host_zeros=rt.host_zeros,
            )
            pool.block[...] = xp.asarray(np.random.default_rng(0).standard_normal(pool.block.shape))
            staging = xp.zeros((*pool.block.shape[:2], 1, *pool.block.shape[3:]), np.float16)
            for src, dst, start, stop in ((2, 0, 0, 11), (0, 3, 0, 40), (1, 2, 39, 40), (3, 1, 7, 23)):
                expected = xp.asnumpy(pool.block)
                expected[:, :, dst, :, start:stop] = expected[:, :, src, :, start:stop]
                rt.copy_positions(pool.block, dst, pool.block, src, start, stop)
                assert xp.asnumpy(pool.block).tobytes() == expected.tobytes()
            for row, start, stop in ((2, 0, 17), (3, 5, 40)):  # pool -> staging -> another pool row
                rt.copy_positions(staging, 0, pool.block, row, start, stop)
                expected = xp.asnumpy(pool.block)
                expected[:, :, 0, :, start:stop] = xp.asnumpy(staging)[:, :, 0, :, start:stop]
                rt.copy_positions(pool.block, 0, staging, 0, start, stop)
                got = xp.asnumpy(pool.block)
                assert got.tobytes() == expected.tobytes()
                assert got[:, :, 0, :, start:stop].tobytes() == got[:, :, row, :, start:stop].tobytes()
            rt.wait_queue()


def test_a_kv_copy_between_blocks_of_other_capacities_moves_exactly_those_positions() -> None:
    """The prompt staging block holds a chunk of positions, the pool a session's capacity: a
    batched prefill's rows go from one to the other by the same kernel."""
    from engine.runtime.cuda_runtime import cuda_runtime

    rt = cuda_runtime(EngineOptions(provider="cuda"))
    xp, rng = rt.xp, np.random.default_rng(1)
    with rt.enter():
        pool = xp.asarray(rng.standard_normal((3, 2, 4, 2, 40, 64)).astype(np.float16))
        staging = xp.asarray(rng.standard_normal((3, 2, 3, 2, 16, 64)).astype(np.float16))
        for dst, src, stop in ((1, 2, 16), (3, 0, 5), (0, 1, 1)):
            expected = xp.asnumpy(pool)
            expected[:, :, dst, :, :stop] = xp.asnumpy(staging)[:, :, src, :, :stop]
            rt.copy_positions(pool, dst, staging, src, 0, stop)
            assert xp.asnumpy(pool).tobytes() == expected.tobytes()
        rt.wait_queue()
