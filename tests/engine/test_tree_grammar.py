"""engine/constrain/tree_grammar.py: a syntax tree run on the pushdown engine admits exactly what
its DFA admits, and references let a JSON schema recurse (the schema side: test_constraints_schema.py)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import numpy as np
import pytest

from engine.constrain import Limits, compile_constraint, json_schema, nfa, regex, tree_grammar
from engine.constrain.compiled import automaton
from engine.constrain.grammar import MASK_DEPTH, CompiledGrammar
from engine.constrain.pattern import Machine, Ref, alt, members, repeat, seq, text
from engine.errors import InvalidInput
from tests.engine.test_constraints import REGEXES, VOCAB, random_walk
from tests.engine.test_constraints_schema import CORPUS

FIELD = "constraint.test"


def pushed(node: Any, rules: dict[str, Any] | None = None) -> CompiledGrammar:
    return CompiledGrammar(tree_grammar.program(node, rules or {}, FIELD), VOCAB, Limits(), FIELD)


@pytest.mark.parametrize("pattern", REGEXES)
def test_a_regex_on_the_pushdown_engine_admits_exactly_what_its_dfa_admits(pattern: str) -> None:
    tree = regex.whole(pattern)
    dfa, grammar = automaton(tree, VOCAB, Limits(), FIELD), pushed(tree)
    alphabet = ["a", "b", "c", "d", "0", "1", "-", " ", "é", "日", "\n", "(", ")", "@", "."]
    for length in range(4):
        for letters in itertools.product(alphabet, repeat=length):
            word = "".join(letters).encode()
            assert dfa.matches(word) == grammar.matches(word), word
    for seed in range(6):
        out, _ = random_walk(dfa, seed)
        assert grammar.matches(out), out


# The corpus' schemas with no recursion and no open value (read strictly) whose DFA can be built
# (an object of ten properties in any order cannot: a state per set of them written).
CLOSED = [
    e
    for e in CORPUS
    if not (found := json_schema.tree(json.dumps(e["schema"]), strict=True)).rules
    and nfa.size(found.root) <= 100_000
]
LARGE = Limits(max_states=50_000)  # past the server's, for the comparison


@pytest.mark.parametrize("entry", CLOSED, ids=lambda e: e["name"])
def test_a_schema_on_the_pushdown_engine_admits_exactly_what_its_dfa_admits(entry: dict[str, Any]) -> None:
    tree = json_schema.tree(json.dumps(entry["schema"]), strict=True).root
    dfa, grammar = automaton(tree, VOCAB, LARGE, FIELD), pushed(tree)
    for seed in range(4):
        out, _ = random_walk(dfa, seed)
        assert grammar.matches(out), out
        for cut in range(0, len(out), max(1, len(out) // 5)):  # every prefix and one-byte change
            for changed in (out[:cut], out[:cut] + b"x" + out[cut + 1 :], out[:cut] + b'"' + out[cut:]):
                assert dfa.matches(changed) == grammar.matches(changed), changed


def test_free_members_admit_every_order_of_each_at_most_once_on_both_engines() -> None:
    """Four free members (b and d required), then an ordered rest of x's: every sequence of up to
    six of them, with and without separators, on the DFA and the pushdown engine alike."""
    items = [(text(n), n in "bd") for n in "abcd"] + [(repeat(text("x"), 1, 2), False)]
    tree = seq(text("<"), members(items, text(","), free=4), text(">"))
    dfa, grammar = automaton(tree, VOCAB, Limits(), FIELD), pushed(tree)
    for size in range(7):
        for picked in itertools.product("abcdx", repeat=size):
            for separator in (",", ""):
                word = f"<{separator.join(picked)}>".encode()
                free = [p for p in picked if p != "x"]
                tail = "".join(picked[len(free) :])
                meant = (
                    len(set(free)) == len(free)
                    and {"b", "d"} <= set(free)
                    and "x" not in picked[: len(free)]
                    and tail in ("", "x", "x" + separator + "x")
                    and (separator == "," or size <= 1)
                )
                assert dfa.matches(word) == grammar.matches(word) == meant, word


def test_repeatable_free_members_come_anywhere_any_number_of_times_on_both_engines() -> None:
    items = [(text(n), n == "b") for n in "ab"] + [(text("y"), False)]
    tree = seq(text("<"), members(items, text(","), free=3, again=1), text(">"))
    dfa, grammar = automaton(tree, VOCAB, Limits(), FIELD), pushed(tree)
    for size in range(7):
        for picked in itertools.product("aby", repeat=size):
            word = f"<{','.join(picked)}>".encode()
            meant = picked.count("a") <= 1 and picked.count("b") == 1
            assert dfa.matches(word) == grammar.matches(word) == meant, word


def test_a_reference_names_a_rule_beside_the_tree_and_may_recurse() -> None:
    nested = alt(text("0"), seq(text("("), Ref("n"), text(")")))
    grammar = pushed(Ref("n"), {"n": nested})
    assert all(grammar.matches(b"(" * k + b"0" + b")" * k) for k in range(50))
    assert not grammar.matches(b"((0)") and not grammar.matches(b"()")


def test_an_endless_reference_is_unsatisfiable_and_one_before_any_output_is_unsupported() -> None:
    with pytest.raises(InvalidInput) as endless:
        pushed(Ref("n"), {"n": seq(text("("), Ref("n"), text(")"))})
    assert endless.value.reason == "CONSTRAINT_UNSATISFIABLE"
    with pytest.raises(InvalidInput) as looped:
        pushed(Ref("n"), {"n": alt(Ref("n"), text("x"))})
    assert looped.value.reason == "SCHEMA_UNSUPPORTED"


def test_a_machine_of_many_states_is_checked_in_time_linear_in_its_rules() -> None:
    """A DFA is a chain of rules, one a state, found finishing from its end: 30,000 of them (the
    checks once swept every rule per rule found, ~10^9 steps here, minutes of CPU)."""
    states = 30_000
    chain = Machine(tuple(((0x61, 0x61, s + 1),) for s in range(states)) + ((),), (False,) * states + (True,))
    program = tree_grammar.program(chain, {}, FIELD, max_elements=1_000_000)
    assert program is not None
    shorter = Machine(tuple(((0x61, 0x61, s + 1),) for s in range(40)) + ((),), (False,) * 40 + (True,))
    grammar = pushed(shorter)
    assert grammar.matches(b"a" * 40) and not grammar.matches(b"a" * 39) and not grammar.matches(b"a" * 41)


def test_a_tree_past_the_element_limit_is_constraint_too_large() -> None:
    with pytest.raises(InvalidInput) as refused:
        listed = {"type": "array", "items": {"$ref": "#/$defs/n"}}
        compile_constraint(
            "json_schema",
            json.dumps({"$defs": {"n": listed}, "$ref": "#/$defs/n"}),
            VOCAB,
            Limits(max_schema_elements=10),
        )
    assert refused.value.reason == "CONSTRAINT_TOO_LARGE"


@pytest.mark.parametrize(
    ("schema", "document"),
    [
        ({"type": "object"}, '{"a":[{"b":[[{"c":{"d":[1,{"e":"x"}]}}]]}],"f":null}'),
        (
            {
                "$defs": {
                    "n": {
                        "type": "object",
                        "properties": {
                            "v": {"type": "integer"},
                            "kids": {"type": "array", "items": {"$ref": "#/$defs/n"}},
                        },
                        "required": ["v"],
                    }
                },
                "$ref": "#/$defs/n",
            },
            '{"v":1,"kids":[{"v":2,"kids":[{"v":3,"kids":[{"v":4}]}]}]}',
        ),
        (
            {
                "type": "array",
                "items": {"type": "object", "properties": {"a": {"type": "array", "items": {}}}},
            },
            '[{"a":[[[{"q":[1,"]}"]}]]]},{}]',
        ),
    ],
)
def test_a_mask_computed_on_a_state_s_top_frames_is_the_state_s_own(schema: Any, document: str) -> None:
    """Masks start from the stacks' top frames (grammar.MASK_DEPTH) and walk the tokens that reach
    below on the whole state: equal to every token walked alone, at every byte of a nested document."""
    compiled = compile_constraint("json_schema", json.dumps(schema), VOCAB)
    assert isinstance(compiled, CompiledGrammar)
    usable = [t for t in range(VOCAB.size) if VOCAB.usable[t]]
    row, deepest = compiled.start(), 0
    for byte in [*document.encode(), None]:
        state = row.state
        deepest = max(deepest, *map(len, state))
        exact = {t for t in usable if compiled.after_bytes(state, VOCAB.pieces[t] or b"") is not None}
        assert set(np.flatnonzero(row.allowed()).tolist()) - set(VOCAB.eos_ids) == exact, byte
        if byte is not None:
            row.advance(byte)  # the synthetic vocabulary's token b is the byte b
    assert row.accepts and deepest > MASK_DEPTH + 2  # the document went below the frames masks start from
