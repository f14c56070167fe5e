"""A byte NFA as a DFA: subset construction over byte equivalence classes.

State 0 is dead (every byte leads back to it), state 1 the start. Guarantees: `table` is int32
[states, 256]; a state from which no accepting state can be reached is merged into the dead
state, so a walk is alive exactly while its bytes can still be completed into a match. More than
`max_states` states, or more than `max_members` NFA states held in subsets and closures together
(their memory), raise nfa.TooLarge; each subset checks the NFA's Budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.constrain import nfa as nfa_
from engine.constrain.nfa import Nfa, TooLarge

DEAD, START = 0, 1


@dataclass(frozen=True)
class Dfa:
    table: np.ndarray  # int32 [states, 256]: the next state
    accepting: np.ndarray  # bool [states]
    byte_class: np.ndarray  # int64 [256]: bytes of one class move alike from every state

    @property
    def states(self) -> int:
        return int(self.table.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.table.nbytes + self.accepting.nbytes)


def determinize(nfa: Nfa, max_states: int, max_members: int = 5_000_000) -> Dfa:
    bounds, moves = _classes(nfa)
    rows, accepting = _subsets(nfa, moves, len(bounds) - 1, max_states, max_members)
    classes = np.asarray(rows, dtype=np.int32).reshape(-1, len(bounds) - 1)
    classes, accepting_arr = _prune(classes, np.asarray(accepting, dtype=bool))
    class_of_byte = np.searchsorted(np.asarray(bounds), np.arange(256), side="right") - 1
    return Dfa(np.ascontiguousarray(classes[:, class_of_byte]), accepting_arr, class_of_byte)


Moves = list[list[tuple[int, int, int]]]  # per NFA state: (first class, end class, target)


def _classes(nfa: Nfa) -> tuple[list[int], Moves]:
    """Byte equivalence classes (bytes no move tells apart) and every move in class ids."""
    cuts = {0, 256}
    for moves in nfa.moves:
        for lo, hi, _ in moves:
            cuts.update((lo, hi + 1))
    bounds = sorted(cuts)
    index = {b: i for i, b in enumerate(bounds)}
    return bounds, [[(index[lo], index[hi + 1], t) for lo, hi, t in moves] for moves in nfa.moves]


def _subsets(
    nfa: Nfa, moves: Moves, width: int, max_states: int, max_members: int
) -> tuple[list[int], list[bool]]:
    """Class-level transition rows (flat) and accepting flags. A DFA state is the set of NFA
    states with a move (or final) reachable without a byte: a frozenset, whose cost follows its
    size and not the NFA's."""
    closures = nfa_.Closures(nfa)
    held = _Held(closures, max_members)
    start = closures.of(nfa.start)
    ids: dict[frozenset[int], int] = {frozenset(): DEAD, start: START}
    sets = [frozenset(), start]
    rows: list[int] = [DEAD] * width
    accepting = [False, nfa.final in start]
    targets = [[(a, b, held.closure(t)) for a, b, t in m] for m in moves]
    i = 0
    while (i := i + 1) < len(sets):
        nfa.budget.check()
        following: list[frozenset[int] | set[int]] = [frozenset()] * width
        for s in sets[i]:
            nfa.budget.tick()
            for a, b, reach in targets[s]:
                for c in range(a, b):
                    now = following[c]
                    if not now:
                        following[c] = reach  # shared until a second set joins it
                    elif isinstance(now, frozenset):
                        following[c] = set(now) | reach
                    else:
                        now |= reach
        for joined in following:
            key = joined if isinstance(joined, frozenset) else frozenset(joined)
            if key not in ids:
                if len(sets) >= max_states:
                    raise TooLarge(f"more than {max_states} DFA states")
                held.add(len(key))
                ids[key] = len(sets)
                sets.append(key)
                accepting.append(nfa.final in key)
            rows.append(ids[key])
    return rows, accepting


class _Held:
    """NFA state ids held in the subsets and the closures: at most `limit` (their memory)."""

    def __init__(self, closures: nfa_.Closures, limit: int) -> None:
        self.closures, self.limit, self.subsets = closures, limit, 0

    def closure(self, state: int) -> frozenset[int]:
        found = self.closures.of(state)
        self.add(0)
        return found

    def add(self, members: int) -> None:
        self.subsets += members
        if self.subsets + self.closures.members > self.limit:
            raise TooLarge(f"more than {self.limit} NFA states held in the DFA's subsets")


def _prune(classes: np.ndarray, accepting: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Send every move into a state that cannot reach acceptance to the dead state."""
    n, width = classes.shape
    edges = np.unique(np.arange(n, dtype=np.int64).repeat(width) * n + classes.ravel())
    sources, targets = edges // n, edges % n
    order = np.argsort(targets, kind="stable")
    starts = np.searchsorted(targets[order], np.arange(n + 1))
    predecessors = sources[order].tolist()
    live = accepting.tolist()
    stack = [int(s) for s in np.flatnonzero(accepting)]
    while stack:
        t = stack.pop()
        for s in predecessors[starts[t] : starts[t + 1]]:
            if not live[s]:
                live[s] = True
                stack.append(s)
    alive = np.asarray(live, dtype=bool)
    alive[DEAD] = False
    return np.where(alive[classes], classes, DEAD).astype(np.int32), accepting & alive
