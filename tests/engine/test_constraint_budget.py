"""A compile's Budget (issue #39): a constraint too costly to compile is refused within about its CPU
allowance, an abandoned compile stops at its next check and is remembered by nobody (a caller
still waiting compiles it itself), and the memory of subsets and subschemas is bounded.

The hostile schema is the issue's: 30 levels of definitions in ~9 KB, each naming the next twice
through $ref (with a keyword beside it, so each use is compiled apart), so the language it
describes doubles at every level.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from engine.constrain import ConstraintCache, Limits, Vocabulary, compile_constraint
from engine.constrain.budget import Abandoned, Budget
from engine.errors import InvalidInput
from tests.support.hostile import fanned_schema

VOCAB = Vocabulary([bytes([i]) for i in range(256)], 257, [256])
BUDGET_S = 0.3


def test_the_hostile_schema_is_small_and_nested_30_deep() -> None:
    assert 5_000 < len(fanned_schema()) < 10_000


def test_a_schema_over_the_budget_is_refused_within_about_the_budget() -> None:
    started = time.thread_time()
    with pytest.raises(InvalidInput) as refused:
        compile_constraint("json_schema", fanned_schema(), VOCAB, budget=Budget(BUDGET_S))
    spent = time.thread_time() - started
    assert refused.value.reason == "CONSTRAINT_TOO_LARGE" and refused.value.field == "json_schema"
    assert "0.3 s of CPU time" in str(refused.value)
    assert BUDGET_S <= spent < BUDGET_S + 0.5


def test_automata_products_are_refused_within_about_the_budget() -> None:
    """Lengths that cut a format, decimal bounds and multipleOf are automata walked side by side:
    their work counts against the budget like the rest of the compile."""
    properties = {f"p{i}": {"type": "string", "format": "email", "maxLength": 30 + i} for i in range(60)}
    started = time.thread_time()
    with pytest.raises(InvalidInput) as refused:
        compile_constraint(
            "json_schema",
            json.dumps({"type": "object", "properties": properties}),
            VOCAB,
            budget=Budget(BUDGET_S),
        )
    spent = time.thread_time() - started
    assert refused.value.reason == "CONSTRAINT_TOO_LARGE", str(refused.value)
    assert BUDGET_S <= spent < BUDGET_S + 0.5


def test_a_schema_expanding_past_its_subschema_limit_is_refused_without_a_budget() -> None:
    with pytest.raises(InvalidInput, match="more than 500 subschemas") as refused:
        compile_constraint("json_schema", fanned_schema(), VOCAB, Limits(max_schema_nodes=500))
    assert refused.value.reason == "CONSTRAINT_TOO_LARGE"


def test_subsets_past_their_member_limit_are_refused() -> None:
    with pytest.raises(InvalidInput, match="NFA states held") as refused:
        compile_constraint("regex", "(a|ab|abc|b|bc)*[abc]{9}", VOCAB, Limits(max_subset_members=200))
    assert refused.value.reason == "CONSTRAINT_TOO_LARGE"
    assert compile_constraint("regex", "(a|ab|abc|b|bc)*[abc]{9}", VOCAB) is not None  # within the default


def test_a_schema_past_the_dfa_limits_runs_on_the_pushdown_engine_admitting_the_same() -> None:
    spec = fanned_schema(2, width=2, words=40)
    small = compile_constraint("json_schema", spec, VOCAB, Limits(max_schema_dfa_states=8_000))
    pushed = compile_constraint("json_schema", spec, VOCAB, Limits(max_subset_members=1_000))
    assert type(small).__name__ == "Automaton" and type(pushed).__name__ == "CompiledGrammar"
    texts = [
        b'{"a":{"a":1,"b":2},"b":{"b":3,"p":"w7"}}',
        b"{}",
        b'{"a":{"b":{}}}',
        b'{"p":"w39"}',
        b'{"p":"w40"}',
        b'{"c":1}',
        b'{"a":1}',
        b'{"b":{},"a":{}}',
        b'{"b":{"p":"w1","a":4},"a":{},"b":{}}',
    ]
    for text in texts:
        assert small.matches(text) == pushed.matches(text), text  # type: ignore[attr-defined]
    assert sum(small.matches(t) for t in texts) == 4  # type: ignore[attr-defined]


def test_a_schema_whose_refs_fan_out_but_stand_alone_compiles_within_the_budget() -> None:
    started = time.thread_time()
    spec = fanned_schema(beside=False, words=3)
    compiled = compile_constraint("json_schema", spec, VOCAB, budget=Budget(BUDGET_S))
    assert time.thread_time() - started < BUDGET_S
    leaf = b'{"a":7,"b":8}'
    for _ in range(29):
        leaf = b'{"a":' + leaf + b',"b":{}}'
    matches = compiled.matches  # type: ignore[attr-defined]
    assert matches(leaf) and not matches(leaf.replace(b"7", b'"7"'))


def test_a_budget_within_reach_changes_nothing() -> None:
    within = compile_constraint("regex", "[a-c]{2,5}x", VOCAB, budget=Budget(5.0))
    plain = compile_constraint("regex", "[a-c]{2,5}x", VOCAB)
    assert (within.start().allowed() == plain.start().allowed()).all()


def test_an_abandoned_compile_stops_at_once_and_is_not_remembered() -> None:
    cache = ConstraintCache(VOCAB)
    budget = Budget(None)
    outcome: list[BaseException] = []
    compiling = threading.Thread(target=lambda: _get(cache, fanned_schema(), budget, outcome))
    compiling.start()
    time.sleep(0.2)
    abandoned = time.perf_counter()
    budget.abandon()
    compiling.join(5)
    assert not compiling.is_alive() and time.perf_counter() - abandoned < 1.0
    assert isinstance(outcome[0], Abandoned)
    with pytest.raises(InvalidInput, match="CPU time"):  # compiled afresh: nothing was remembered
        cache.get("json_schema", fanned_schema(), Budget(0.05))


def test_a_caller_waiting_for_an_abandoned_compile_compiles_the_spec_itself() -> None:
    cache = ConstraintCache(VOCAB)
    spec = fanned_schema(6)  # ~1 s of CPU time: long enough to be left midway, short enough to finish
    first, second = Budget(None), Budget(30.0)
    outcomes: list[Any] = []
    leaving = threading.Thread(target=lambda: _get(cache, spec, first, outcomes))
    leaving.start()
    time.sleep(0.1)
    staying = threading.Thread(target=lambda: _get(cache, spec, second, outcomes))
    staying.start()
    time.sleep(0.1)
    first.abandon()
    leaving.join(5)
    staying.join(30)
    assert isinstance(outcomes[0], Abandoned) and not isinstance(outcomes[1], BaseException)
    stats = cache.stats()
    assert (stats.misses, stats.hits, stats.entries) == (2, 1, 1)  # claimed, waited, compiled again


def test_a_waiting_caller_that_leaves_stops_waiting_and_the_compile_goes_on() -> None:
    cache = ConstraintCache(VOCAB)
    spec = fanned_schema(5)
    outcomes: list[Any] = []
    compiling = threading.Thread(target=lambda: _get(cache, spec, Budget(30.0), outcomes))
    compiling.start()
    time.sleep(0.05)
    waiting_budget = Budget(30.0)
    waiting = threading.Thread(target=lambda: _get(cache, spec, waiting_budget, outcomes))
    waiting.start()
    waiting_budget.abandon()
    waiting.join(5)
    compiling.join(30)
    assert sorted(type(o).__name__ for o in outcomes) == ["Abandoned", "CompiledGrammar"]
    assert cache.peek("json_schema", spec) is not None


def _get(cache: ConstraintCache, spec: str, budget: Budget, outcomes: list[Any]) -> None:
    try:
        outcomes.append(cache.get("json_schema", spec, budget))
    except (Abandoned, InvalidInput) as exc:
        outcomes.append(exc)


def test_a_steps_allowance_gives_up_after_its_count_of_ticks_whatever_the_clock() -> None:
    from engine.constrain.budget import OverBudget, Steps

    allowance = Steps(3)
    for _ in range(3):
        allowance.tick()
    assert allowance.left == 0
    with pytest.raises(OverBudget):
        allowance.tick()
