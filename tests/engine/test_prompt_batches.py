"""New prompts sharing a prefill forward (issue 28): their first chunks of one ladder width run as
one forward of B prompts, B on a bounded ladder, on the CUDA backend's code run on the host
(numpy buffers, CPU provider). The tokens are those each prompt gets alone; the shapes stay
bounded; the rows are never shared as a fresh run's; nothing of it in the deterministic mode."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from engine.executor import DecodeRow, EngineOptions, Session
from engine.executor.engine import Engine
from engine.executor.sizing import prompt_staging_bytes
from engine.executor.stats import kv_position_bytes
from engine.executor.step import Open, Prefill, Step, StepResult
from engine.model import load_model_info
from engine.modelgen.synthetic import TINY, build_synthetic
from engine.planner import PromptGroup, prompt_batches, prompt_groups
from engine.runtime.cpu import CpuBackend
from engine.sampling import Sampler, SamplingParams
from tests.support.engines import host_device_engine
from tests.support.prompts import prompt_ids

GREEDY = Sampler(SamplingParams())
LENGTHS = (5, 7, 12, 30, 40, 44, 45, 100)  # TINY's chunk is 64: rungs 22, 44, 64; 100 takes two chunks


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_synthetic(TINY, tmp_path_factory.mktemp("models"))


device_engine = host_device_engine


def burst(engine: Engine, prompts: Sequence[Sequence[int]], new: int) -> list[list[int]]:
    """Every prompt as a Generate's session in the same steps, then `new` greedy tokens each."""
    sessions: list[Session] = engine.step(Step(opens=(Open(count=len(prompts)),))).opens[0].get()
    requests = [
        Prefill(s, tuple(p), samplers=(GREEDY,), batchable=True)
        for s, p in zip(sessions, prompts, strict=True)
    ]
    firsts: dict[int, int] = {}
    while len(firsts) < len(prompts):
        pending = [(i, r) for i, r in enumerate(requests) if i not in firsts]
        result: StepResult = engine.step(Step(prefills=tuple((r, 0) for _, r in pending)))
        for (i, request), outcome in zip(pending, result.prefills, strict=True):
            progress = outcome.get()
            if progress.done:
                firsts[i] = progress.tokens[0]
            else:
                requests[i] = Prefill(request.session, samplers=(GREEDY,), task=progress.task, batchable=True)
    outputs = [[firsts[i]] for i in range(len(prompts))]
    for _ in range(new - 1):
        rows = [DecodeRow(s, out[-1], GREEDY) for s, out in zip(sessions, outputs, strict=True)]
        for out, token in zip(outputs, engine.decode(rows), strict=True):
            out.append(token)  # type: ignore[arg-type]
    for session in sessions:
        engine.close_session(session)
    return outputs


def alone(engine: Engine, prompt: Sequence[int], new: int) -> list[int]:
    session = engine.open_session()
    engine.append(session, prompt)
    out = [engine.choose(session, GREEDY)]
    while len(out) < new:
        out.append(engine.decode([DecodeRow(session, out[-1], GREEDY)])[0])  # type: ignore[arg-type]
    engine.close_session(session, keep=False)
    return out


# -- the plan: pure values ----------------------------------------------------------------------


def test_the_number_of_prompts_a_forward_takes_is_on_a_bounded_ladder() -> None:
    assert prompt_batches(8) == (2, 4, 8)
    assert prompt_batches(6) == (2, 4)
    assert prompt_batches(1) == () == prompt_batches(0)


def test_every_group_holds_prompts_of_one_width_and_fits_the_smallest_size_that_holds_it() -> None:
    widths = [171, 512, None, 171, 512, 512, 342, 171]
    groups = prompt_groups(widths, (2, 4))
    assert groups == (PromptGroup(171, 4, (0, 3, 7)), PromptGroup(512, 4, (1, 4, 5)))
    for group in groups:
        assert {widths[i] for i in group.items} == {group.width}
        assert group.size == min(s for s in (2, 4) if s >= len(group.items))


def test_a_lone_prompt_or_one_that_cannot_share_runs_alone() -> None:
    assert prompt_groups([171, None, 342, 512], (2, 4, 8)) == ()
    assert prompt_groups([171, 171], ()) == ()


def test_a_burst_wider_than_the_largest_size_splits_in_arrival_order() -> None:
    groups = prompt_groups([64] * 11, (2, 4, 8))
    assert [g.items for g in groups] == [tuple(range(8)), (8, 9, 10)]
    assert [g.size for g in groups] == [8, 4]


# -- the engine ---------------------------------------------------------------------------------


def test_prompts_sharing_a_forward_get_the_tokens_each_gets_alone(model_dir: Path) -> None:
    prompts = [prompt_ids(n, n) for n in LENGTHS]
    together = device_engine(model_dir, prefill_batch=4)
    outputs = burst(together, prompts, 6)
    single = device_engine(model_dir, prefill_batch=1)
    assert outputs == [alone(single, p, 6) for p in prompts]
    stats = together.stats()
    # Rungs 22 (5, 7, 12), 44 (30, 40, 44), 64 (45 and 100's first chunk): three shared forwards.
    assert (stats.prompt_forwards, stats.prompts_batched) == (3, 8)
    assert single.stats().prompt_forwards == 0
    assert (stats.prompt_batch, single.stats().prompt_batch) == (4, 1)


def test_the_memory_budget_counts_the_prompt_variants_and_the_staging_block_they_run_in(
    model_dir: Path,
) -> None:
    batched = device_engine(model_dir, prefill_batch=4)
    single = device_engine(model_dir, prefill_batch=1)
    block = prompt_staging_bytes(batched.info, 4, max(batched.padded_ladder))
    assert batched._variant_reserve(8) - single._variant_reserve(8) > block > 0  # its variants too
    # The block counted is the block allocated (beside the staging row both bind), and stats say so.
    assert batched.staging_bytes - single.staging_bytes == block
    assert single.staging_bytes == single.capacity * kv_position_bytes(single.info)
    assert batched.memory().variants >= batched.staging_bytes
    # A budget that holds three slots where prompts prefill alone holds fewer where they share.
    budget = single.weights_bytes + 3 * single.slot_bytes + single._variant_reserve(3)
    assert device_engine(model_dir, prefill_batch=1, memory_budget_bytes=budget).pool.rows == 3
    assert device_engine(model_dir, prefill_batch=4, memory_budget_bytes=budget).pool.rows < 3


def test_a_second_burst_of_the_same_widths_prepares_no_new_variant(model_dir: Path) -> None:
    engine = device_engine(model_dir, prefill_batch=4)
    engine.warm_up()
    prepared = engine.variants.prepared
    burst(engine, [prompt_ids(n, n) for n in LENGTHS], 2)
    burst(engine, [prompt_ids(n, n + 1) for n in reversed(LENGTHS)], 2)
    assert engine.variants.prepared == prepared
    assert {e.key.prompts for e in engine.variants.stats().entries} >= {2, 4}
    assert engine.stats().eager_forwards == 0


def test_rows_from_a_shared_forward_are_never_shared_as_a_fresh_runs_prefix(model_dir: Path) -> None:
    prompts = [prompt_ids(64, 1) + prompt_ids(8, 3), prompt_ids(64, 2) + prompt_ids(8, 4)]
    for batch, shared in ((1, 64), (4, 0)):  # a whole first chunk: shareable when computed alone
        engine = device_engine(model_dir, prefill_batch=batch)
        burst(engine, [p[:64] for p in prompts], 1)  # both close keeping their rows as held prefixes
        again = engine.open_session(prompt=prompts[0])
        assert again.length == shared


def test_a_session_prefill_alone_is_never_batched(model_dir: Path) -> None:
    engine = device_engine(model_dir, prefill_batch=4)
    sessions = engine.open_sessions(Open(count=2))
    requests = tuple((Prefill(s, tuple(prompt_ids(30, i))), 0) for i, s in enumerate(sessions))
    engine.step(Step(prefills=requests))
    assert engine.stats().prompt_forwards == 0 and [s.length for s in sessions] == [30, 30]


def test_no_prompts_share_a_forward_in_the_deterministic_mode_or_on_the_cpu(model_dir: Path) -> None:
    assert device_engine(model_dir, prefill_batch=4, deterministic=True).prompt_sizes == ()
    assert device_engine(model_dir, prefill_batch=1).prompt_sizes == ()
    info, options = load_model_info(model_dir), EngineOptions(capacity=512, prefill_batch=4)
    cpu = Engine(info, options, CpuBackend(info, options))
    assert cpu.prompt_sizes == () and cpu.facts.prompt_batch == 1


def test_a_closed_session_in_a_group_fails_alone_and_the_others_prefill(model_dir: Path) -> None:
    engine = device_engine(model_dir, prefill_batch=4)
    sessions = engine.open_sessions(Open(count=3))
    prompts = [prompt_ids(30, i) for i in range(3)]
    tasks = [engine.start_prefill(s, p) for s, p in zip(sessions, prompts, strict=True)]
    engine.close_session(sessions[1])
    items = tuple(
        (Prefill(s, samplers=(GREEDY,), task=t, batchable=True), 0)
        for s, t in zip(sessions, tasks, strict=True)
    )
    result = engine.step(Step(prefills=items))
    assert result.prefills[1].error is not None
    tokens = [o.get().tokens[0] for i, o in enumerate(result.prefills) if i != 1]
    single = device_engine(model_dir, prefill_batch=1)
    assert tokens == [alone(single, prompts[i], 1)[0] for i in (0, 2)]
    assert engine.stats().prompts_batched == 2
