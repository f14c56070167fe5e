"""The syntax tree every constraint kind compiles to before it becomes a byte automaton (nfa.py).

Characters are Unicode code points (surrogates excluded, so every match is valid UTF-8); literal
text is bytes. The constructors `seq`, `alt`, `repeat` and `chars` simplify as they build: the
empty language (`NOTHING`) absorbs a sequence and drops out of an alternation, so a tree built
through them never holds a part that cannot match.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

MAX_CODE_POINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)

Ranges = tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class Chars:
    """One character from a set: sorted, disjoint, inclusive code point ranges."""

    ranges: Ranges


@dataclass(frozen=True, slots=True)
class Text:
    """Literal bytes."""

    data: bytes


@dataclass(frozen=True, slots=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Alt:
    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Repeat:
    """`item` at least `lo` times, at most `hi` (None: unbounded), with `separator` (if any)
    between two items: `x (, x)*` without writing `x` twice (a JSON array)."""

    item: Node
    lo: int
    hi: int | None
    separator: Node | None = None


@dataclass(frozen=True, slots=True)
class Members:
    """A subsequence of `items` joined by `separator`, holding every `required` one: JSON object
    members. The first `free` items may come in any order, each at most once (an object's declared
    properties, as writers order them); the rest follow them in order (in order, nfa.py builds it in
    linear size; in any order, a state per set of items written: the pushdown engine keeps the set
    in its stack frame). A free item must start with a byte (a member's key does). `least`: at
    least one free item is written (minProperties 1). The last `again` free items may be written
    any number of times, anywhere among the others (members whose keys no declared name spells).
    `rules`: (free item i, sets of free items): where i is written, all of one of those sets are
    too (JSON Schema's dependencies), read on the set written as `complete` does."""

    items: tuple[Node, ...]
    required: tuple[bool, ...]
    separator: Node
    free: int = 0
    least: bool = False
    again: int = 0
    rules: Rules = ()


Rules = tuple[tuple[int, tuple[int, ...]], ...]  # (member, alternatives): bit sets of free members


def complete(written: int, needed: int, rules: Rules) -> bool:
    """Whether free members `written` (a bit each) may end: every `needed` one, and for each rule
    whose member is written, every member of one of its alternatives. Rules only ask for more
    members, so writing more can always complete a set."""
    if written & needed != needed:
        return False
    return all(
        not written >> member & 1 or any(written & alternative == alternative for alternative in alternatives)
        for member, alternatives in rules
    )


@dataclass(frozen=True, slots=True)
class Anchor:
    """A regex's `^` (start) or `$` (end): matches the empty string where it is allowed."""

    end: bool


@dataclass(frozen=True, slots=True)
class Ref:
    """The tree of rule `name` (a table beside the tree holds it): how a recursive JSON Schema $ref
    is written. Only the pushdown engine (tree_grammar.py) runs trees with references."""

    name: str


@dataclass(frozen=True, slots=True)
class Machine:
    """A small DFA over bytes, for languages a tree writes only at great size (the decimals a
    multipleOf admits: a state per remainder). `moves[s]`: (first byte, last byte, target) of state
    s; 0 is the start; `accepting[s]`: whether a match may end in s. Every state can reach an
    accepting one."""

    moves: tuple[tuple[tuple[int, int, int], ...], ...]
    accepting: tuple[bool, ...]


Node = Chars | Text | Seq | Alt | Repeat | Members | Anchor | Ref | Machine

EMPTY = Seq(())
NOTHING = Alt(())


def seq(*items: Node) -> Node:
    flat: list[Node] = []
    for item in items:
        if item == NOTHING:
            return NOTHING
        flat.extend(item.items if isinstance(item, Seq) else (item,))
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


def alt(*items: Node) -> Node:
    flat: list[Node] = []
    for item in items:
        flat.extend(item.items if isinstance(item, Alt) else (item,))
    return flat[0] if len(flat) == 1 else Alt(tuple(flat))


def repeat(item: Node, lo: int, hi: int | None, separator: Node | None = None) -> Node:
    if hi is not None and hi < lo:
        return NOTHING
    if item == NOTHING or hi == 0:
        return EMPTY if lo == 0 else NOTHING
    if (lo, hi) == (1, 1):
        return item
    if separator is not None and (separator == NOTHING or hi == 1):
        return repeat(item, lo, 1)
    return Repeat(item, lo, hi, separator)


def members(
    items: Iterable[tuple[Node, bool]],
    separator: Node,
    free: int = 0,
    least: bool = False,
    again: int = 0,
    rules: Rules = (),
) -> Node:
    """`Members` of (item, required) pairs, the first `free` in any order (`least`: one of them at
    least; the last `again` of them any number of times); an optional item that cannot match drops
    out. `rules` (Members') count the items given, so none of those may be NOTHING."""
    given = list(items)
    kept = [
        (item, req, i < free, free - again <= i < free)
        for i, (item, req) in enumerate(given)
        if item != NOTHING or req
    ]
    assert not rules or len(kept) == len(given), "rules over items that drop out"
    if any(item == NOTHING for item, _, _, _ in kept):
        return NOTHING
    loose = sum(f for _, _, f, _ in kept)
    if loose < 2:  # one free item has a single order: required where one at least is; repeated, a repeat
        if least and not loose:
            return NOTHING
        kept = [
            (repeat(item, 1, None, separator) if a else item, req or least and f, False, False)
            for item, req, f, a in kept
        ]
    if not kept:
        return EMPTY
    return Members(
        tuple(i for i, _, _, _ in kept),
        tuple(r for _, r, _, _ in kept),
        separator,
        sum(f for _, _, f, _ in kept),
        least and loose > 1,
        sum(a for _, _, _, a in kept),
        rules if loose > 1 else (),  # one free item: its rules name only itself
    )


def optional(item: Node) -> Node:
    return repeat(item, 0, 1)


def text(value: str) -> Node:
    return Text(value.encode("utf-8")) if value else EMPTY


def chars(ranges: Iterable[tuple[int, int]]) -> Node:
    """One character from the union of `ranges` (surrogates removed); NOTHING if none is left."""
    kept = normalize(subtract(normalize(ranges), (SURROGATES,)))
    return Chars(kept) if kept else NOTHING


def char_set(values: str) -> Node:
    return chars((ord(c), ord(c)) for c in values)


def normalize(ranges: Iterable[tuple[int, int]]) -> Ranges:
    """Sorted, merged, clipped to the code point range."""
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted((max(lo, 0), min(hi, MAX_CODE_POINT)) for lo, hi in ranges):
        if lo > hi:
            continue
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return tuple(merged)


def complement(ranges: Ranges) -> Ranges:
    gaps, start = [], 0
    for lo, hi in ranges:
        if lo > start:
            gaps.append((start, lo - 1))
        start = hi + 1
    if start <= MAX_CODE_POINT:
        gaps.append((start, MAX_CODE_POINT))
    return tuple(gaps)


def subtract(ranges: Ranges, removed: Ranges) -> Ranges:
    return intersect(ranges, complement(normalize(removed)))


def intersect(a: Ranges, b: Ranges) -> Ranges:
    out = [(max(lo1, lo2), min(hi1, hi2)) for lo1, hi1 in a for lo2, hi2 in b]
    return normalize(r for r in out if r[0] <= r[1])
