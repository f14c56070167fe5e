"""Prefix reuse in the engine: forks, prompts that start from a held prefix, held rows and their eviction.

Real onnxruntime on a generated decoder (chunk width 64, so prefixes are found in units of its
ladder step, 22, and then shared to the last token a prompt repeats). The reference for every
greedy continuation is a fresh engine with prefix sharing off that prefilled the
whole prompt itself.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.errors import Exhausted, InvalidInput
from engine.executor import EngineOptions
from engine.executor.engine import Engine
from engine.executor.prefix import PrefixIndex, agreed, chain
from engine.model import load_model_info
from engine.planner import prefix_unit
from engine.planner.restore import recompute_from
from tests.support.engines import greedy, load
from tests.support.prompts import common_prefix, prompt_ids

CHUNK = 64
UNIT = prefix_unit(CHUNK)  # 22


@pytest.fixture(scope="module")
def model(model_dir: object) -> Path:
    return model_dir()  # type: ignore[operator, no-any-return]


def recompute(model: Path, tokens: list[int], steps: int) -> list[int]:
    engine = load(model, prefix_sharing=False, max_sessions=1)
    return greedy(engine, engine.open_session(), steps, tokens)


def test_a_forked_session_continues_exactly_as_a_session_that_prefilled_everything(model: Path) -> None:
    engine = load(model, max_sessions=4)
    tokens = prompt_ids(150, seed=1)
    source = engine.open_session()
    engine.append(source, tokens)
    fork = engine.fork(source)
    assert (fork.length, fork.tokens, fork.has_logits) == (150, tokens, True)
    expected = recompute(model, tokens, 12)
    assert greedy(engine, fork, 12) == expected
    assert greedy(engine, source, 12) == expected  # the source continues on its own, untouched


def test_a_fork_at_a_shorter_length_equals_a_session_that_prefilled_that_many_tokens(model: Path) -> None:
    engine = load(model, max_sessions=4)
    tokens = prompt_ids(150, seed=2)
    source = engine.open_session()
    engine.append(source, tokens)
    fork = engine.fork(source, 97)
    assert fork.length == 97 and source.length == 150
    assert greedy(engine, fork, 10) == recompute(model, tokens[:97], 10)
    assert engine.fork(source, 0).has_logits is False


def test_fork_errors_name_the_length_and_the_exhausted_pool(model: Path) -> None:
    engine = load(model, max_sessions=2)
    source = engine.open_session()
    engine.append(source, prompt_ids(20, seed=3))
    with pytest.raises(InvalidInput, match="cannot keep 21 tokens: the session holds 20"):
        engine.fork(source, 21)
    engine.fork(source)
    with pytest.raises(Exhausted):
        engine.fork(source)


def test_a_prompt_starting_with_a_held_prefix_shares_all_it_repeats_and_prefills_the_rest_exactly(
    model: Path,
) -> None:
    engine = load(model, max_sessions=4)
    system = prompt_ids(150, seed=4)
    first = engine.open_session(prompt=system + prompt_ids(30, seed=5))
    engine.append(first, system + prompt_ids(30, seed=5))
    engine.close_session(first)  # its row keeps the KV
    assert engine.stats().prefix.rows_held == 1
    second_prompt = system + prompt_ids(40, seed=6)
    second = engine.open_session(prompt=second_prompt)
    shared = common_prefix(system + prompt_ids(30, seed=5), second_prompt)
    assert second.length == shared >= 150 and second.row == first.row  # taken as it is
    rest = second_prompt[second.length :]
    plan = engine.plan(second, len(rest))
    assert plan.forwards[0].past == shared and all(f.width in (*engine.ladder, f.rows) for f in plan.forwards)
    assert greedy(engine, second, 12, rest) == recompute(model, second_prompt, 12)
    stats = engine.stats().prefix
    assert (stats.hits, stats.tokens_saved) == (1, shared)


def test_a_prefix_is_copied_from_a_live_session_and_the_source_is_untouched(model: Path) -> None:
    engine = load(model, max_sessions=4)
    system = prompt_ids(200, seed=7)
    live = engine.open_session()
    engine.append(live, system)
    tokens = system[:130] + prompt_ids(20, seed=8)
    copy = engine.open_session(prompt=tokens)
    assert copy.length == common_prefix(system, tokens) >= 130 and copy.row != live.row
    assert greedy(engine, copy, 10, tokens[copy.length :]) == recompute(model, tokens, 10)
    assert greedy(engine, live, 10) == recompute(model, system, 10)


def test_an_empty_session_shares_the_prefix_of_its_first_prompt(model: Path) -> None:
    engine = load(model, max_sessions=4)
    system = prompt_ids(100, seed=9)
    live = engine.open_session()
    engine.append(live, system + [5])
    empty = engine.open_session()
    tokens = system + prompt_ids(10, seed=10)
    shared = common_prefix(system + [5], tokens)
    assert engine.share_prefix(empty, tokens) == shared >= 100
    assert greedy(engine, empty, 8, tokens[shared:]) == recompute(model, tokens, 8)


def test_a_prefix_is_never_shared_with_another_scope(model: Path) -> None:
    engine = load(model, max_sessions=4)
    tokens = prompt_ids(150, seed=11)
    alice = engine.open_session(scope="alice")
    engine.append(alice, tokens)
    engine.close_session(alice)
    assert engine.open_session(scope="bob", prompt=tokens).length == 0
    assert engine.open_session(scope="alice", prompt=tokens).length == 148  # all but the last two


def test_a_prompt_no_longer_than_a_unit_or_sharing_off_shares_nothing(model: Path) -> None:
    tokens = prompt_ids(150, seed=12)
    for engine, probe in (
        (load(model, max_sessions=2), tokens[:UNIT]),
        (load(model, max_sessions=2, prefix_sharing=False), tokens),
    ):
        held = engine.open_session()
        engine.append(held, tokens)
        assert engine.open_session(prompt=probe).length == 0  # at least one token must be prefilled
        assert engine.stats().prefix.hits == 0


def test_held_prefixes_never_keep_a_slot_from_a_session_that_needs_one(model: Path) -> None:
    engine = load(model, max_sessions=3)
    prompts = [prompt_ids(100, seed=20 + i) for i in range(3)]
    for tokens in prompts:
        session = engine.open_session()
        engine.append(session, tokens)
        engine.close_session(session)  # each closes before the next opens: all on row 0, moved up
    assert engine.free_slots == 3
    sessions = [engine.open_session(prompt=prompt_ids(100, seed=40 + i)) for i in range(3)]
    assert [s.length for s in sessions] == [0, 0, 0]
    stats = engine.stats().prefix
    assert stats.rows_held == 0 and stats.bytes_held == 0 and stats.evictions == 3
    assert engine.free_slots == 0


def test_held_prefixes_stay_inside_the_pool_the_memory_budget_sized(model: Path) -> None:
    roomy = load(model, max_sessions=8)
    three_rows = roomy.weights_bytes + 3 * roomy.slot_bytes + roomy._variant_reserve(3)
    engine = load(model, max_sessions=8, memory_budget_bytes=three_rows + roomy.slot_bytes // 2)
    assert engine.pool.rows == 3
    for seed in range(6):  # more prefixes than rows: the oldest go
        session = engine.open_session(prompt=prompt_ids(130, seed=70 + seed))
        engine.append(session, prompt_ids(130, seed=70 + seed)[session.length :])
        engine.close_session(session)
    stats = engine.stats()
    assert stats.prefix.rows_held == 3 and stats.prefix.evictions == 3
    assert stats.prefix.bytes_held <= stats.memory.kv
    assert stats.memory.total <= engine.options.memory_budget_bytes
    sessions = [engine.open_session() for _ in range(3)]  # every row is still there for sessions
    assert len({s.row for s in sessions}) == 3 and engine.stats().prefix.rows_held == 0


def test_the_least_recently_used_prefix_is_evicted_first_and_the_others_stay_exact(model: Path) -> None:
    engine = load(model, max_sessions=3)
    old, recent = prompt_ids(100, seed=30), prompt_ids(100, seed=31)
    for tokens in (old, recent):
        session = engine.open_session()
        engine.append(session, tokens)
        engine.close_session(session)
    assert engine.stats().prefix.rows_held == 2
    for i in range(2):  # one row stays free: one of the two prefixes must go
        engine.open_session(prompt=prompt_ids(100, seed=32 + i))
    assert engine.stats().prefix.rows_held == 1
    assert engine.stats().prefix.evictions == 1
    reuse = engine.open_session(prompt=recent + [1])  # the one held prefix left is the recent one
    assert reuse.length == 99  # two tokens left to run
    assert greedy(engine, reuse, 8, (recent + [1])[reuse.length :]) == recompute(model, recent + [1], 8)


def test_no_slot_leaks_after_forks_shares_and_closes(model: Path) -> None:
    engine = load(model, max_sessions=4)
    tokens = prompt_ids(140, seed=50)
    for _ in range(5):
        source = engine.open_session(prompt=tokens)
        engine.append(source, tokens[source.length :])
        forks = [engine.fork(source, n) for n in (0, 64, 140)]
        for session in (source, *forks):
            engine.close_session(session)
        assert engine.free_slots == 4 and engine.sessions_open == 0
    assert engine.stats().prefix.rows_held <= 4


def test_the_index_confirms_hits_by_tokens_not_by_hashes() -> None:
    index = PrefixIndex(4)
    held = list(range(12))
    index.sync(0, held)
    assert index.find(held[:9], {0: held}).length == 7  # type: ignore[union-attr]
    assert index.find(held[:8], {0: held}).length == 6  # type: ignore[union-attr]  # two tokens left to run
    assert index.find(held[:9], {0: [99] * 12}) is None  # stale tokens under the same row: no hit
    index.truncate(0, 5)
    assert index.find(held[:9], {0: held[:5]}).length == 5  # type: ignore[union-attr]
    assert chain(held, 4, 2) == chain(held[:8] + [7], 4, 2) != chain([1, *held[1:]], 4, 2)


def test_a_hit_runs_on_past_its_last_whole_unit_to_the_holder_that_repeats_the_most_tokens() -> None:
    index = PrefixIndex(4)
    held = {0: list(range(20)), 1: [*range(10), 99, 99], 2: [*range(6)], 3: [50, *range(1, 20)]}
    prompt = [*range(11), 77, 78, 79]
    hit = index.find(prompt, held)
    assert hit is not None and (hit.length, hit.rows) == (11, (0,))  # row 1 stops at 10, row 2 at 6
    assert index.find([*range(6), 5, 5, 5], held).rows == (0, 1, 2)  # type: ignore[union-attr]
    assert index.find(list(range(20)), held).length == 18  # type: ignore[union-attr]  # the last two run
    assert index.find([*range(3), 9, 9], held) is None  # not one whole unit in common


def test_the_run_on_ends_exactly_where_the_held_tokens_and_the_prompt_first_differ() -> None:
    rng = np.random.default_rng(5)
    for _ in range(2000):
        n = int(rng.integers(0, 40))
        held, prompt = [int(t) for t in rng.integers(0, 3, n)], [int(t) for t in rng.integers(0, 3, n)]
        start = int(rng.integers(0, n + 1))
        stop = int(rng.integers(start, n + 1))
        held[:start] = prompt[:start]
        end = start
        while end < stop and held[end] == prompt[end]:
            end += 1
        assert agreed(held, prompt, start, stop) == end


def test_device_backend_forks_and_shares_exactly_through_the_staging_row(model: Path) -> None:
    from engine.runtime.cuda import CudaBackend, host_runtime

    options = EngineOptions(max_sessions=4)
    info = load_model_info(model)
    engine = Engine(info, options, CudaBackend(info, options, host_runtime()))
    system = prompt_ids(150, seed=60)
    source = engine.open_session()
    engine.append(source, system)
    idle = engine.open_session()
    engine.append(idle, prompt_ids(70, seed=61))  # the staging row now holds another row
    engine.close_session(idle)
    fork = engine.fork(source, 100)  # lands on the row the staging row last held
    assert greedy(engine, fork, 10) == recompute(model, system[:100], 10)
    tokens = system[:140] + prompt_ids(9, seed=62)
    shared = engine.open_session(prompt=tokens)
    # Its rows follow the forward's width, so the prefix is shared only where a fresh run of the
    # prompt starts a forward (engine.planner.restore), not over all 140 common rows.
    held = common_prefix(system, tokens)
    assert held >= 140
    assert shared.length == recompute_from(held, held, len(tokens), engine.chunk_size, True) > 0
    assert greedy(engine, shared, 10, tokens[shared.length :]) == recompute(model, tokens, 10)
