"""`compile_constraint`: one entry for every constraint kind, and the protocol its result keeps.

Regex, JSON Schema and choice become a syntax tree, a byte NFA, then a DFA (automaton.py); a
grammar is parsed by engine/constrain/gbnf.py and run by grammar.py as a pushdown automaton
with the same RowState protocol, and so is a JSON Schema that recurses or is too large for a
DFA (its tree made a grammar by tree_grammar.py). Every failure is InvalidInput naming the
request field at fault; a compile past its Budget's CPU time too (CONSTRAINT_TOO_LARGE), one
abandoned raises Abandoned.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Sequence
from dataclasses import replace
from typing import Protocol

import numpy as np

from engine.constrain import dfa, grammar, json_schema, nfa, regex, tree_grammar
from engine.constrain.automaton import Automaton
from engine.constrain.budget import UNBOUNDED, Budget, OverBudget
from engine.constrain.limits import DEFAULT_LIMITS, Limits
from engine.constrain.pattern import Node, alt, text
from engine.constrain.vocabulary import Vocabulary
from engine.errors import InvalidInput

JSON_SCHEMA_STRICT = "json_schema_strict"  # a JSON schema read as OpenAI's strict mode does
KINDS = ("json_schema", JSON_SCHEMA_STRICT, "regex", "choice", "grammar")


def field_of(kind: str) -> str:
    """The input a kind's errors name as at fault (InvalidInput.field): the kind's own name (the
    request field that holds it is the service's business: service/errors.py)."""
    return "json_schema" if kind == JSON_SCHEMA_STRICT else kind


class RowState(Protocol):
    """One generated sequence's place in a constraint (see engine/constrain/__init__.py)."""

    def allowed(self) -> np.ndarray: ...

    @property
    def state_key(self) -> Hashable: ...

    def advance(self, token: int) -> None: ...

    @property
    def done(self) -> bool: ...

    @property
    def accepts(self) -> bool: ...

    def copy(self) -> RowState: ...


class Compiled(Protocol):
    """A compiled constraint, shared by every row that generates under it."""

    def start(self) -> RowState: ...

    def warm(self, stop: threading.Event | None = None) -> int:
        """Compute masks ahead (a thread of its own runs it after the compile); how many."""
        ...

    @property
    def nbytes(self) -> int: ...


def compile_constraint(
    kind: str,
    spec: str | Sequence[str],
    vocabulary: Vocabulary,
    limits: Limits = DEFAULT_LIMITS,
    budget: Budget = UNBOUNDED,
) -> Compiled:
    if kind not in KINDS:
        raise InvalidInput(
            f"unknown constraint kind {kind!r} (one of {', '.join(KINDS)})",
            reason="CONSTRAINT_KIND_UNKNOWN",
            field="kind",
        )
    try:
        return _compile(kind, spec, vocabulary, limits, budget)
    except OverBudget as exc:
        raise InvalidInput(
            f"the constraint is too costly to compile: {exc}",
            reason="CONSTRAINT_TOO_LARGE",
            field=field_of(kind),
        ) from exc


def _compile(
    kind: str, spec: str | Sequence[str], vocabulary: Vocabulary, limits: Limits, budget: Budget
) -> Compiled:
    field = field_of(kind)
    if kind == "choice":
        return automaton(choice_tree(spec, limits), vocabulary, limits, field, budget)
    cap = limits.max_spec_bytes if kind in ("grammar", "regex") else limits.max_schema_bytes
    source = _text_spec(spec, cap, field)
    if kind == "grammar":
        return _grammar(source, vocabulary, limits, budget)
    try:
        if kind == "regex":
            return automaton(regex.whole(source), vocabulary, limits, field, budget)
        return _json_schema(source, vocabulary, limits, budget, strict=kind == JSON_SCHEMA_STRICT)
    except RecursionError as exc:  # nesting the parsers let through but the tree walks cannot follow
        raise InvalidInput(
            "the constraint nests too deeply", reason="CONSTRAINT_TOO_LARGE", field=field
        ) from exc


def _json_schema(
    source: str, vocabulary: Vocabulary, limits: Limits, budget: Budget, strict: bool
) -> Compiled:
    """A DFA where the schema fits one (every mask can be computed ahead); the pushdown engine
    (lazy: the parser states rows reach) where it recurses through a $ref, holds an open value
    (any JSON value, at any depth: its DFA would be large and cut at some depth) or its NFA
    would pass max_schema_nfa_states, or its DFA max_schema_dfa_states."""
    field = field_of("json_schema")
    found = json_schema.tree(source, limits, budget, strict=strict)
    if not found.rules and nfa.size(found.root) <= limits.max_schema_nfa_states:
        try:
            return automaton(
                found.root,
                vocabulary,
                replace(limits, max_states=limits.max_schema_dfa_states),
                field,
                budget,
            )
        except InvalidInput as exc:
            if exc.reason != "CONSTRAINT_TOO_LARGE":
                raise
    program = tree_grammar.program(found.root, found.rules, field, limits.max_schema_elements)
    budget.check()
    return grammar.CompiledGrammar(program, vocabulary, limits, field)


def automaton(
    tree: Node, vocabulary: Vocabulary, limits: Limits, field: str, budget: Budget = UNBOUNDED
) -> Automaton:
    try:
        built = nfa.build(tree, limits.max_nfa_states, budget)
        table = dfa.determinize(built, limits.max_states, limits.max_subset_members)
    except nfa.TooLarge as exc:
        raise InvalidInput(
            f"the constraint compiles to too large an automaton ({exc})",
            reason="CONSTRAINT_TOO_LARGE",
            field=field,
        ) from exc
    if not table.accepting.any():
        raise InvalidInput(
            "the constraint matches no output at all", reason="CONSTRAINT_UNSATISFIABLE", field=field
        )
    return Automaton(table, vocabulary, field)


def choice_tree(options: str | Sequence[str], limits: Limits) -> Node:
    field = field_of("choice")
    if isinstance(options, str) or not options:
        raise InvalidInput("a choice needs a non-empty list of options", reason="CHOICE_INVALID", field=field)
    if any(not isinstance(o, str) or not o for o in options):
        raise InvalidInput(
            "every choice option must be a non-empty string", reason="CHOICE_INVALID", field=field
        )
    size = sum(len(o.encode("utf-8", "surrogatepass")) for o in options)
    if len(options) > limits.max_choices or size > limits.max_choice_bytes:
        raise InvalidInput(
            f"a choice holds at most {limits.max_choices} options of "
            f"{limits.max_choice_bytes} bytes together ({len(options)}, {size} given)",
            reason="CONSTRAINT_TOO_LARGE",
            field=field,
        )
    try:
        return alt(*(text(o) for o in options))
    except UnicodeEncodeError as exc:
        raise InvalidInput(
            "a choice option is not valid Unicode text (a lone surrogate)",
            reason="CHOICE_INVALID",
            field=field,
        ) from exc


def _text_spec(spec: str | Sequence[str], cap: int, field: str) -> str:
    if not isinstance(spec, str):
        raise InvalidInput("this constraint kind takes one text", reason="CONSTRAINT_INVALID", field=field)
    size = len(spec.encode("utf-8", "surrogatepass"))
    if size > cap:
        raise InvalidInput(
            f"the constraint's text is {size} bytes, over the {cap} limit",
            reason="CONSTRAINT_TOO_LARGE",
            field=field,
        )
    return spec


def _grammar(source: str, vocabulary: Vocabulary, limits: Limits, budget: Budget) -> Compiled:
    """A grammar's parse is linear in its text and its states are bounded (grammar.py): the budget
    is checked before it and after."""
    budget.check()
    compiled: Compiled = grammar.compile_grammar(source, vocabulary, limits)
    budget.check()
    return compiled
