"""How large a constraint may grow: one frozen value, checked while it compiles.

A constraint past a limit fails its request with InvalidInput (reason CONSTRAINT_TOO_LARGE or,
for the inputs' own size, the kind's field) before it can use unbounded time or memory.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    # DFA states (a table row is 1 KiB: 20 MiB at most) and the NFA states built on the way.
    max_states: int = 20_000
    max_nfa_states: int = 200_000
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


DEFAULT_LIMITS = Limits()
