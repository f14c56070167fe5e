"""A syntax tree (pattern.py) as a byte NFA: Thompson's construction, one byte range per move.

Guarantees: a fragment never adds a move into its own entry state (loops run through fresh
states), so alternatives may share an entry; a character class costs one state per distinct
UTF-8 suffix; `Members` in order costs two copies of each member, not a quadratic regex (in
any order, a state per set of members written and a copy of each member per set). More than
`max_states` states raise TooLarge before any more memory is spent; each state ticks the
compile's Budget, and so does each state an epsilon closure walks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.constrain import utf8
from engine.constrain.budget import UNBOUNDED, Budget
from engine.constrain.pattern import Alt, Anchor, Chars, Machine, Members, Node, Repeat, Seq, Text, complete


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
    budget: Budget = UNBOUNDED

    def new(self) -> int:
        self.budget.tick()
        if len(self.moves) >= self.max_states:
            raise TooLarge(f"more than {self.max_states} NFA states")
        self.moves.append([])
        self.eps.append([])
        return len(self.moves) - 1


def build(node: Node, max_states: int, budget: Budget = UNBOUNDED) -> Nfa:
    nfa = Nfa(max_states, budget=budget)
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
    if isinstance(node, Machine):
        return _machine(nfa, node, start)
    assert isinstance(node, Anchor), node
    return start


def size(node: Node, found: dict[int, int] | None = None) -> int:
    """About how many states `build` would make of `node` (each shared subtree counted at each
    use, as build copies it), found in time linear in the distinct subtrees: a tree that shares
    parts can describe an NFA far larger than itself."""
    found = {} if found is None else found
    known = found.get(id(node))
    if known is not None:
        return known
    if isinstance(node, Text):
        count = len(node.data)
    elif isinstance(node, Chars):
        count = 1 if node.ranges[-1][1] < 0x80 else 1 + sum(len(s) - 1 for s in utf8.sequences(node.ranges))
    elif isinstance(node, Seq | Alt):
        count = isinstance(node, Alt) + sum(size(item, found) for item in node.items)
    elif isinstance(node, Repeat):
        copies = node.hi if node.hi is not None else max(node.lo, 1)
        each = size(node.item, found) + (0 if node.separator is None else size(node.separator, found))
        count = 2 + copies * each
    elif isinstance(node, Members):
        separator = size(node.separator, found)
        count = 1 + sum(2 * size(item, found) + separator + 1 for item in node.items[node.free :])
        if node.free:  # a hub per set written; each member from each set that lacks it
            loose = node.items[: node.free]
            each = sum(size(item, found) + separator for item in loose)
            count += (1 << len(loose)) + (1 << len(loose) - 1) * each
    elif isinstance(node, Machine):
        count = len(node.accepting) + 1
    else:
        count = 1
    found[id(node)] = count
    return count


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
    end = nfa.new()
    if node.lo == 0:
        nfa.eps[state].append(end)
    before = max(node.lo, 1) - 1  # items written before the loop or the optional tail
    for i in range(before):
        state = _one(nfa, node, state, first=i == 0)
    if node.hi is None:
        # One copy of the item loops: entry (fresh) -> item -> exit -> separator -> entry.
        if before and node.separator is not None:
            state = _add(nfa, node.separator, state)
        entry = nfa.new()
        nfa.eps[state].append(entry)
        exit_ = _add(nfa, node.item, entry)
        back = exit_ if node.separator is None else _add(nfa, node.separator, exit_)
        nfa.eps[back].append(entry)
        nfa.eps[exit_].append(end)
        return end
    for i in range(before, node.hi):
        # Nested optionals, x(x(x)?)?: one way to match each count keeps the DFA small.
        state = _one(nfa, node, state, first=i == 0)
        if i + 1 >= node.lo:
            nfa.eps[state].append(end)
    return end


def _one(nfa: Nfa, node: Repeat, state: int, first: bool) -> int:
    if not first and node.separator is not None:
        state = _add(nfa, node.separator, state)
    return _add(nfa, node.item, state)


def _machine(nfa: Nfa, node: Machine, start: int) -> int:
    """Fresh states for the machine's (none is the entry: its start may be moved into)."""
    states = [nfa.new() for _ in node.accepting]
    end = nfa.new()
    nfa.eps[start].append(states[0])
    for state, moves, accepting in zip(states, node.moves, node.accepting, strict=True):
        nfa.moves[state].extend((lo, hi, states[target]) for lo, hi, target in moves)
        if accepting:
            nfa.eps[state].append(end)
    return end


def _members(nfa: Nfa, node: Members, start: int) -> int:
    """Two tracks: `none` (nothing written yet: no separator next) and `some`."""
    none, some = _free(nfa, node, start) if node.free else (start, None)
    for item, required in zip(node.items[node.free :], node.required[node.free :], strict=True):
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


def _free(nfa: Nfa, node: Members, start: int) -> tuple[int | None, int | None]:
    """The free members in any order, each at most once (the last `again` any number of times): a
    hub state per set written (`start` for none), each member missing from a set (or repeatable)
    leading from its hub to the hub of the set with it. The
    `none` and `some` tracks' states once every required free member is written."""
    loose = node.items[: node.free]
    needed = sum(1 << i for i, required in enumerate(node.required[: node.free]) if required)
    again = len(loose) - node.again  # from this one on, written any number of times
    hubs, queue, some = {0: start}, [0], nfa.new()
    for written in queue:  # sets in the order first reached: each after the sets inside it
        hub = hubs[written]
        if written and complete(written, needed, node.rules):
            nfa.eps[hub].append(some)
        for i, item in enumerate(loose):
            bit = 1 << i
            if written & bit and i < again:
                continue
            end = _add(nfa, item, hub if not written else _add(nfa, node.separator, hub))
            if written | bit not in hubs:
                hubs[written | bit] = nfa.new()
                queue.append(written | bit)
            nfa.eps[end].append(hubs[written | bit])
    return (start if not needed and not node.least else None), some


class Closures:
    """Where each NFA state leads without a byte: the states with a move (or the final one)
    reachable through epsilon moves alone, computed once per state on demand. `members` counts
    the states they hold together (the caller bounds it: their memory)."""

    def __init__(self, nfa: Nfa) -> None:
        self.nfa = nfa
        self._found: dict[int, frozenset[int]] = {}
        self.members = 0

    def of(self, state: int) -> frozenset[int]:
        found = self._found.get(state)
        if found is None:
            found = self._found[state] = frozenset(self._walk(state))
            self.members += len(found)
        return found

    def _walk(self, state: int) -> set[int]:
        nfa, seen, stack, kept = self.nfa, {state}, [state], set()
        while stack:
            nfa.budget.tick()
            s = stack.pop()
            if nfa.moves[s] or s == nfa.final:
                kept.add(s)
            for t in nfa.eps[s]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        return kept
