"""Languages a syntax tree writes only at great size, built as small DFAs (pattern.Machine): the
decimals a multipleOf admits (a state per remainder), and the intersection or difference of two
trees' automata (lengths that cut a pattern, values a `not` rules out, bounds on both sides),
and a tree's matcher of given texts.
Each walks the trees' DFAs side by side over byte classes, refused (nfa.TooLarge) past
MAX_MULTIPLE_STATES states, its work counted against the compile's Budget.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from engine.constrain import dfa, nfa
from engine.constrain.budget import UNBOUNDED, Budget
from engine.constrain.pattern import (
    NOTHING,
    Alt,
    Anchor,
    Chars,
    Machine,
    Members,
    Node,
    Ref,
    Repeat,
    Seq,
    Text,
)

MAX_MULTIPLE_STATES = 20_000  # a multipleOf's machine: the number's states times the remainders


def multiples(number: Node, numerator: int, places: int, budget: Budget = UNBOUNDED) -> Node:
    """The strings of `number` (digits, at most one `.`, an optional `-`; no exponent) whose value
    is a multiple of numerator / 10**places: the number's DFA walked beside the remainder, mod
    `numerator`, of its digits read as one integer with the fraction padded to `places` digits.
    Past `places` fraction digits only zeros are written. nfa.TooLarge past MAX_MULTIPLE_STATES."""
    table = dfa.determinize(nfa.build(number, MAX_MULTIPLE_STATES, budget), MAX_MULTIPLE_STATES)
    moves = [
        [(byte, target) for byte, target in enumerate(row) if target != dfa.DEAD]
        for row in table.table.tolist()
    ]
    ends = table.accepting.tolist()
    start = (dfa.START, 0, -1)  # (number's state, remainder, fraction digits so far: -1 before ".")
    ids, order = {start: 0}, [start]
    edges: list[list[tuple[int, int, int]]] = []  # per state: (byte, byte, target)
    while len(edges) < len(order):
        budget.tick()
        state, rest, fraction = order[len(edges)]
        out = []
        for byte, target in moves[state]:
            if 0x30 <= byte <= 0x39 and fraction < places:
                after = (target, (rest * 10 + byte - 0x30) % numerator, fraction + (fraction >= 0))
            elif 0x30 <= byte <= 0x39:
                if byte != 0x30:
                    continue
                after = (target, rest, fraction)
            else:
                after = (target, rest, 0 if byte == ord(".") else fraction)
            if after not in ids:
                if len(order) >= MAX_MULTIPLE_STATES:
                    raise nfa.TooLarge(f"more than {MAX_MULTIPLE_STATES} states for a multipleOf")
                ids[after] = len(order)
                order.append(after)
            out.append((byte, byte, ids[after]))
        edges.append(out)
    accepting = [
        ends[state] and rest * pow(10, places - max(fraction, 0), numerator) % numerator == 0
        for state, rest, fraction in order
    ]
    return machine(edges, accepting)


def machine(edges: list[list[tuple[int, int, int]]], accepting: list[bool]) -> Node:
    """A Machine of the states that can reach an accepting one (state 0 the start; NOTHING where it
    cannot); `edges[s]`: (first byte, last byte, target), adjacent ranges to one target joined."""
    before: list[list[int]] = [[] for _ in edges]
    for state, out in enumerate(edges):
        for _, _, target in out:
            before[target].append(state)
    live = list(accepting)
    stack = [state for state, ends in enumerate(accepting) if ends]
    while stack:
        for state in before[stack.pop()]:
            if not live[state]:
                live[state] = True
                stack.append(state)
    if not live[0]:
        return NOTHING
    kept = [state for state in range(len(edges)) if live[state]]
    index = {state: i for i, state in enumerate(kept)}
    moves = []
    for state in kept:
        ranges: list[tuple[int, int, int]] = []
        for lo, hi, target in sorted(edges[state]):
            if not live[target]:
                continue
            if ranges and ranges[-1][1] == lo - 1 and ranges[-1][2] == index[target]:
                ranges[-1] = (ranges[-1][0], hi, index[target])
            else:
                ranges.append((lo, hi, index[target]))
        moves.append(tuple(ranges))
    return Machine(tuple(moves), tuple(accepting[state] for state in kept))


def difference(
    first: Node, second: Node, budget: Budget = UNBOUNDED, limit: int = MAX_MULTIPLE_STATES
) -> Node:
    """The strings `first` matches and `second` does not, as a Machine (nfa.TooLarge past `limit`
    states, the operands' DFAs' or the product's)."""
    return _product(first, second, budget, keep_dead=True, accepts=lambda a, b: a and not b, limit=limit)


def intersection(
    first: Node, second: Node, budget: Budget = UNBOUNDED, limit: int = MAX_MULTIPLE_STATES
) -> Node:
    """The strings both nodes match, as a Machine: their DFAs walked side by side.
    nfa.TooLarge past `limit` states."""
    return _product(first, second, budget, keep_dead=False, accepts=lambda a, b: a and b, limit=limit)


def _product(
    first: Node, second: Node, budget: Budget, keep_dead: bool, accepts: Any, limit: int = MAX_MULTIPLE_STATES
) -> Node:
    """Both DFAs walked side by side (the second's dead state kept where `keep_dead`), a pair
    accepting as `accepts(first accepts, second accepts)` says; bytes that neither DFA tells
    apart are walked once, as one class."""
    tables = [dfa.determinize(nfa.build(node, limit, budget), limit) for node in (first, second)]
    kinds = [t.byte_class for t in tables]
    joint, representative, of_byte = np.unique(
        kinds[0] * (int(kinds[1].max()) + 1) + kinds[1], return_index=True, return_inverse=True
    )
    ranges: list[list[tuple[int, int]]] = [[] for _ in joint]  # each class's bytes, as ranges
    for byte, kind in enumerate(of_byte.ravel().tolist()):
        if ranges[kind] and ranges[kind][-1][1] == byte - 1:
            ranges[kind][-1] = (ranges[kind][-1][0], byte)
        else:
            ranges[kind].append((byte, byte))
    columns = [t.table[:, representative].tolist() for t in tables]  # [state][class] -> next
    start = (dfa.START, dfa.START)
    ids, order = {start: 0}, [start]
    edges: list[list[tuple[int, int, int]]] = []
    while len(edges) < len(order):
        budget.tick()
        a, b = order[len(edges)]
        out: list[tuple[int, int, int]] = []
        for kind, (target, other) in enumerate(zip(columns[0][a], columns[1][b], strict=True)):
            if target == dfa.DEAD or other == dfa.DEAD and not keep_dead:
                continue
            pair = (target, other)
            if pair not in ids:
                if len(order) >= limit:
                    raise nfa.TooLarge(f"more than {limit} states for an intersection or difference")
                ids[pair] = len(order)
                order.append(pair)
            out.extend((lo, hi, ids[pair]) for lo, hi in ranges[kind])
        edges.append(out)
    ends = [table.accepting.tolist() for table in tables]
    return machine(edges, [accepts(ends[0][a], ends[1][b]) for a, b in order])


def matcher(node: Node, budget: Budget = UNBOUNDED) -> Callable[[bytes], bool]:
    """Whether `node` (a tree without Ref: one automaton) matches a text: its DFA built once, each
    text walked through it (nfa.TooLarge past MAX_MULTIPLE_STATES states)."""
    table = dfa.determinize(nfa.build(node, MAX_MULTIPLE_STATES, budget), MAX_MULTIPLE_STATES)

    def matches(data: bytes) -> bool:
        state = dfa.START
        for byte in data:
            state = int(table.table[state, byte])
            if state == dfa.DEAD:
                return False
        return bool(table.accepting[state])

    return matches


def refers(node: Node, seen: set[int] | None = None) -> bool:
    """Whether a tree holds a Ref (then only the pushdown engine runs it)."""
    seen = set() if seen is None else seen
    if id(node) in seen:
        return False
    seen.add(id(node))
    if isinstance(node, Ref):
        return True
    if isinstance(node, Seq | Alt | Members):
        return any(refers(item, seen) for item in node.items) or (
            isinstance(node, Members) and refers(node.separator, seen)
        )
    if isinstance(node, Repeat):
        return refers(node.item, seen) or node.separator is not None and refers(node.separator, seen)
    return False


UTF8_LEADS = frozenset(range(0xC2, 0xF5))  # the first byte of any character past U+007F


def first_bytes(node: Node) -> frozenset[int] | None:
    """The bytes a match of `node` may start with (a superset where characters past U+007F are
    met), or None where a match may be empty or a Ref hides what it starts with."""
    found = _leads(node)
    return None if found is None or found[1] else found[0]


def _leads(node: Node) -> tuple[frozenset[int], bool] | None:
    """(bytes a match may start with, whether it may be empty); None: unknown (a Ref)."""
    if isinstance(node, Text):
        return (frozenset(node.data[:1]), not node.data)
    if isinstance(node, Chars):
        low = {c for lo, hi in node.ranges for c in range(lo, min(hi, 0x7F) + 1)}
        return (
            frozenset(low) | (UTF8_LEADS if node.ranges and node.ranges[-1][1] > 0x7F else frozenset()),
            False,
        )
    if isinstance(node, Anchor):
        return (frozenset(), True)
    if isinstance(node, Machine):
        return (frozenset(b for lo, hi, _ in node.moves[0] for b in range(lo, hi + 1)), node.accepting[0])
    if isinstance(node, Repeat):
        once = _leads(node.item)
        return None if once is None else (once[0], once[1] or node.lo == 0)
    if isinstance(node, Alt):
        parts = [_leads(item) for item in node.items]
        if any(p is None for p in parts):
            return None
        return (frozenset().union(*(p[0] for p in parts if p)), any(p[1] for p in parts if p))
    if isinstance(node, Members):
        # The first member written is a free one or one up to the first required one (or any,
        # none required).
        last = node.required.index(True) if True in node.required else len(node.items) - 1
        found = [_leads(item) for item in node.items[: max(last + 1, node.free)]]
        if any(f is None or f[1] for f in found):
            return None  # a member that may be empty: the separator may lead
        return (frozenset().union(*(f[0] for f in found if f)), True not in node.required)
    if isinstance(node, Seq):
        leads: frozenset[int] = frozenset()
        for item in node.items:
            step = _leads(item)
            if step is None:
                return None
            leads |= step[0]
            if not step[1]:
                return (leads, False)
        return (leads, True)
    return None
