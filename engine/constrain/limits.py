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
    # Text of a regex, a JSON schema or a grammar, in UTF-8 bytes.
    max_spec_bytes: int = 65_536
    # A choice: how many options, and their UTF-8 bytes together.
    max_choices: int = 4_096
    max_choice_bytes: int = 65_536
    # Containers nested inside a value a schema leaves open ({}, "type": "object" alone).
    max_json_depth: int = 3
    # Times one $ref may be entered along one path through the schema (recursion's bound).
    max_ref_depth: int = 3
    # Subschemas nested in a schema (guards the compiler's own recursion).
    max_schema_depth: int = 64
    # Subschemas compiled, each $ref entered counting again: a schema whose references fan out
    # (two to the next level, 30 levels) describes 2**30 of them in a few KB.
    max_schema_nodes: int = 20_000


DEFAULT_LIMITS = Limits()
