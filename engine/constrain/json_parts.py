"""What the parts of a JSON Schema compile (json_lowering.py, json_objects.py, json_arrays.py,
json_one_of.py) ask of the compiler (json_schema._Compiler): narrow protocols, so no part imports
the compiler back."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol

from engine.constrain.budget import Budget
from engine.constrain.limits import Limits
from engine.constrain.pattern import Node


class Subschemas(Protocol):
    """Subschemas compiled, merged as an allOf, flattened into one schema, typed."""

    def node(self, schema: Any, pointer: str) -> Node: ...

    def merged(self, members: list[tuple[Any, str]], pointer: str) -> Node: ...

    def flattened(self, member: Any, pointer: str, depth: int) -> dict[str, Any] | None: ...

    def types(self, schema: dict[str, Any], pointer: str) -> list[str]: ...


class Compiling(Subschemas, Protocol):
    """And the compile's reading (strict or the spec's), its budget and limits, and $ref targets."""

    strict: bool
    budget: Budget
    limits: Limits

    def resolve(self, target: str, pointer: str) -> Any: ...


class Combining(Compiling, Protocol):
    """And the rules recursive $refs and open values refer to, a schema as its keywords show it
    (a $ref alone: its target), and a part compiled aside (its reading, its rules not kept)."""

    rules: dict[str, Node]

    def in_view(self, schema: Any) -> Any: ...

    def aside(self, strict: bool) -> AbstractContextManager[None]: ...
