"""Whether a compiled JSON-schema constraint admits a JSON instance, written as the engine writes
JSON (compact: no whitespace; strings as json.dumps writes them, characters unescaped) in any
order of each object's members: the engine writes declared properties in declared order and
other members after them, so an instance is admitted when some order of its members is. A byte
walk (`initial`, `after_bytes`, `final` of engine/constrain's Automaton and CompiledGrammar)
with the orders searched depth first, dead prefixes pruned at once.

    admits(compiled, value) -> True | False | None (None: the search passed its step budget)

`admits_as_written(compiled, value)` walks one writing only, MaskBench's: `json.dumps(value,
ensure_ascii=False)` (one space after `:` and `,`, members in the instance's own order).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

MAX_STEPS = 50_000  # members tried in one search


class OverSteps(Exception):
    pass


def admits(compiled: Any, value: Any, max_steps: int = MAX_STEPS) -> bool | None:
    steps = [max_steps]
    try:
        return any(compiled.final(state) for state in _written(compiled, compiled.initial, value, steps))
    except OverSteps:
        return None


def admits_as_written(compiled: Any, value: Any) -> bool:
    try:
        text = json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:  # a lone surrogate: its escape
        text = json.dumps(value).encode()
    state = compiled.after_bytes(compiled.initial, text)
    return state is not None and bool(compiled.final(state))


def _written(compiled: Any, state: Any, value: Any, steps: list[int]) -> Iterator[Any]:
    """Every state (alive) after writing `value` from `state`, one per order of members that fits."""
    if isinstance(value, dict):
        members = list(value.items())
        everything = frozenset(range(len(members)))
        yield from _members(
            compiled, compiled.after_bytes(state, b"{"), members, everything, True, steps, set()
        )
    elif isinstance(value, list):
        yield from _items(compiled, compiled.after_bytes(state, b"["), value, True, steps)
    else:
        for text in _scalar_texts(value):
            after = compiled.after_bytes(state, text)
            if after is not None:
                yield after


def _members(
    compiled: Any,
    state: Any,
    members: list[tuple[str, Any]],
    left: frozenset[int],
    first: bool,
    steps: list[int],
    seen: set[tuple[Any, frozenset[int]]],
) -> Iterator[Any]:
    """The states after the members `left` (indices into `members`) in any order, then `}`; a
    (state, left) pair already searched is not searched again."""
    if state is None or (state, left) in seen:
        return
    seen.add((state, left))
    if not left:
        after = compiled.after_bytes(state, b"}")
        if after is not None:
            yield after
        return
    # Each key that can come next, with its value's first writing; tried first: the one after which
    # the most other keys can follow (declared order, where the schema writes members in it: a later
    # key first leaves the earlier ones dead).
    tries = []
    for i in sorted(left):
        steps[0] -= 1
        if steps[0] < 0:
            raise OverSteps
        head = (b"" if first else b",") + json.dumps(members[i][0], ensure_ascii=False).encode() + b":"
        keyed = compiled.after_bytes(state, head)
        if keyed is None:
            continue
        writings = _written(compiled, keyed, members[i][1], steps)
        found = next(writings, None)
        if found is not None:
            followers = _followers(compiled, found, members, left - {i})
            tries.append((-followers, i, itertools.chain([found], writings)))
    for _, i, writings in sorted(tries, key=lambda t: t[:2]):
        for written in writings:
            yield from _members(compiled, written, members, left - {i}, False, steps, seen)


def _followers(compiled: Any, state: Any, members: list[tuple[str, Any]], left: frozenset[int]) -> int:
    heads = (b"," + json.dumps(members[j][0], ensure_ascii=False).encode() + b":" for j in left)
    return sum(compiled.after_bytes(state, head) is not None for head in heads)


def _items(compiled: Any, state: Any, left: list[Any], first: bool, steps: list[int]) -> Iterator[Any]:
    if state is None:
        return
    if not left:
        after = compiled.after_bytes(state, b"]")
        if after is not None:
            yield after
        return
    start = state if first else compiled.after_bytes(state, b",")
    if start is None:
        return
    for written in _written(compiled, start, left[0], steps):
        yield from _items(compiled, written, left[1:], False, steps)


def _scalar_texts(value: Any) -> list[bytes]:
    """The ways a scalar may be written: a whole float also as an integer (1.0 and 1)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return [str(int(value)).encode(), json.dumps(value).encode()]
    try:
        return [json.dumps(value, ensure_ascii=False).encode()]
    except UnicodeEncodeError:  # a lone surrogate: its escape
        return [json.dumps(value).encode()]
