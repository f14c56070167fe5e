"""engine/constrain/tree_grammar.py: a syntax tree run on the pushdown engine admits exactly what
its DFA admits, and references let a JSON schema recurse (the schema side: test_constraints_schema.py)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from engine.constrain import Limits, compile_constraint, json_schema, regex, tree_grammar
from engine.constrain.compiled import automaton
from engine.constrain.grammar import CompiledGrammar
from engine.constrain.pattern import Ref, alt, seq, text
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


@pytest.mark.parametrize("entry", [e for e in CORPUS if "$ref" not in json.dumps(e["schema"])],
                         ids=lambda e: e["name"])
def test_a_schema_on_the_pushdown_engine_admits_exactly_what_its_dfa_admits(entry: dict[str, Any]) -> None:
    tree = json_schema.tree(json.dumps(entry["schema"]), open_depth=Limits().max_json_depth).root
    dfa, grammar = automaton(tree, VOCAB, Limits(), FIELD), pushed(tree)
    for seed in range(4):
        out, _ = random_walk(dfa, seed)
        assert grammar.matches(out), out
        for cut in range(0, len(out), max(1, len(out) // 5)):  # every prefix and one-byte change
            for changed in (out[:cut], out[:cut] + b"x" + out[cut + 1 :], out[:cut] + b'"' + out[cut:]):
                assert dfa.matches(changed) == grammar.matches(changed), changed


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


def test_a_tree_past_the_element_limit_is_constraint_too_large() -> None:
    with pytest.raises(InvalidInput) as refused:
        listed = {"type": "array", "items": {"$ref": "#/$defs/n"}}
        compile_constraint("json_schema", json.dumps({"$defs": {"n": listed}, "$ref": "#/$defs/n"}),
                           VOCAB, Limits(max_schema_elements=10))
    assert refused.value.reason == "CONSTRAINT_TOO_LARGE"
