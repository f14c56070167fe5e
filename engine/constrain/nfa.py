"""A syntax tree (pattern.py) as a byte NFA: Thompson's construction, one byte range per move.

Guarantees: a fragment never adds a move into its own entry state (loops run through fresh
states), so alternatives may share an entry; a character class costs one state per distinct
UTF-8 suffix; `Members` costs two copies of each member, not a quadratic regex. More than
`max_states` states raise TooLarge before any more memory is spent.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.constrain import utf8
from engine.constrain.pattern import Alt, Anchor, Chars, Members, Node, Repeat, Seq, Text


class TooLarge(Exception):
    """The automaton would pass its state limit."""


@dataclass
class Nfa:
    """`moves[s]`: (first byte, last byte, target); `eps[s]`: targets without a byte."""

    max_states: int
    moves: list[list[tuple[int, int, int]]] = field(default_factory=list)
    eps: list[list[int]] = field(default_factory=list)
    start: int = 0
    final: int = 0

    def new(self) -> int:
        if len(self.moves) >= self.max_states:
            raise TooLarge(f"more than {self.max_states} NFA states")
        self.moves.append([])
        self.eps.append([])
        return len(self.moves) - 1


def build(node: Node, max_states: int) -> Nfa:
    nfa = Nfa(max_states)
    nfa.start = nfa.new()
    nfa.final = _add(nfa, node, nfa.start)
    return nfa


def _add(nfa: Nfa, node: Node, start: int) -> int:
    """Wire `node` from `start`; return the state where it ends."""
    if isinstance(node, Text):
        return _text(nfa, node.data, start)
    if isinstance(node, Chars):
        return _chars(nfa, node, start)
    if isinstance(node, Seq):
        for item in node.items:
            start = _add(nfa, item, start)
        return start
    if isinstance(node, Alt):
        return _alt(nfa, node, start)
    if isinstance(node, Repeat):
        return _repeat(nfa, node, start)
    if isinstance(node, Members):
        return _members(nfa, node, start)
    assert isinstance(node, Anchor), node
    return start


def _text(nfa: Nfa, data: bytes, state: int) -> int:
    for byte in data:
        target = nfa.new()
        nfa.moves[state].append((byte, byte, target))
        state = target
    return state


def _chars(nfa: Nfa, node: Chars, start: int) -> int:
    end = nfa.new()
    suffixes: dict[utf8.ByteRanges, int] = {(): end}

    def suffix(rest: utf8.ByteRanges) -> int:
        if rest not in suffixes:
            state = nfa.new()
            nfa.moves[state].append((rest[0][0], rest[0][1], suffix(rest[1:])))
            suffixes[rest] = state
        return suffixes[rest]

    for ranges in utf8.sequences(node.ranges):
        nfa.moves[start].append((ranges[0][0], ranges[0][1], suffix(ranges[1:])))
    return end


def _alt(nfa: Nfa, node: Alt, start: int) -> int:
    end = nfa.new()
    for item in node.items:
        nfa.eps[_add(nfa, item, start)].append(end)
    return end


def _repeat(nfa: Nfa, node: Repeat, state: int) -> int:
    for _ in range(node.lo):
        state = _add(nfa, node.item, state)
    if node.hi is None:
        loop = nfa.new()
        nfa.eps[state].append(loop)
        nfa.eps[_add(nfa, node.item, loop)].append(loop)
        return loop
    end = nfa.new()
    for _ in range(node.hi - node.lo):
        # Nested optionals, x(x(x)?)?: one way to match each count keeps the DFA small.
        nfa.eps[state].append(end)
        state = _add(nfa, node.item, state)
    nfa.eps[state].append(end)
    return end


def _members(nfa: Nfa, node: Members, start: int) -> int:
    """Two tracks: `none` (nothing written yet: no separator next) and `some`."""
    none: int | None = start
    some: int | None = None
    for item, required in zip(node.items, node.required, strict=True):
        written = nfa.new()
        if none is not None:
            nfa.eps[_add(nfa, item, none)].append(written)
        if some is not None:
            nfa.eps[_add(nfa, item, _add(nfa, node.separator, some))].append(written)
            if not required:
                nfa.eps[some].append(written)
        if none is not None and not required:
            skipped = nfa.new()
            nfa.eps[none].append(skipped)
            none = skipped
        else:
            none = None
        some = written
    end = nfa.new()
    for state in (none, some):
        if state is not None:
            nfa.eps[state].append(end)
    return end


def closures(nfa: Nfa) -> list[int | None]:
    """A lazily filled table: `closure(nfa, table, s)` fills entry s."""
    return [None] * len(nfa.moves)


def closure(nfa: Nfa, table: list[int | None], state: int) -> int:
    """The states reachable from `state` without a byte, as a bit set (bit s: state s)."""
    cached = table[state]
    if cached is not None:
        return cached
    seen, stack, bits = {state}, [state], 0
    while stack:
        s = stack.pop()
        bits |= 1 << s
        for t in nfa.eps[s]:
            if t not in seen:
                seen.add(t)
                stack.append(t)
    table[state] = bits
    return bits
