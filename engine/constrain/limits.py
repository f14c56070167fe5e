"""How large a constraint may grow: one frozen value, checked while it compiles.

A constraint past a limit fails its request with InvalidInput (reason CONSTRAINT_TOO_LARGE or,
for the inputs' own size, the kind's field) before it can use unbounded memory; time is bounded
apart, by the compile's Budget (budget.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    # DFA states (a table row is 1 KiB: 20 MiB at most) and the NFA states built on the way.
    max_states: int = 20_000
    max_nfa_states: int = 200_000
    # NFA state ids held in the DFA's subsets and epsilon closures together (~30 bytes each: their
    # memory, which the state counts alone do not bound, stays under ~150 MiB).
    max_subset_members: int = 5_000_000
    # Text of a regex or a grammar, in UTF-8 bytes; of a JSON schema (real-world ones, Kubernetes'
    # among them, pass 64 KiB; the compile's Budget and max_schema_nodes bound the work).
    max_spec_bytes: int = 65_536
    max_schema_bytes: int = 1 << 20
    # A choice: how many options, and their UTF-8 bytes together.
    max_choices: int = 4_096
    max_choice_bytes: int = 65_536
    # Times a $ref with keywords beside it may be entered along one path through the schema (a $ref
    # alone recurses to any depth, through the pushdown engine).
    max_ref_depth: int = 3
    # DFA states of a JSON schema's automaton, and NFA states (about) it is built from; past either,
    # the schema runs on the pushdown engine.
    max_schema_dfa_states: int = 4_000
    max_schema_nfa_states: int = 100_000
    # Grammar elements a JSON schema run on the pushdown engine may compile to (~72 bytes each).
    max_schema_elements: int = 1 << 18
    # The pushdown engine (grammar.py; grammars, and JSON schemas run there): elements of a GBNF
    # grammar's rules, repetitions expanded; stacks in one parser state (its ambiguity at one byte;
    # more: CONSTRAINT_TOO_LARGE, also mid-generation); interned states before the transition table
    # starts again (1 KiB each); masks cached per grammar, packed (vocabulary / 8 bytes each: 3 MiB
    # at 49k); states whose masks `warm` computes ahead (half the cache, room for the rest).
    max_grammar_elements: int = 1 << 16
    max_grammar_stacks: int = 4_096
    max_grammar_states: int = 4_096
    max_grammar_masks: int = 512
    max_grammar_warm: int = 256
    # Subschemas nested in a schema (guards the compiler's own recursion).
    max_schema_depth: int = 64
    # Subschemas compiled, each $ref entered counting again: a schema whose references fan out
    # (two to the next level, 30 levels) describes 2**30 of them in a few KB.
    max_schema_nodes: int = 20_000


DEFAULT_LIMITS = Limits()
