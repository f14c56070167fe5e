"""A DFA over bytes as a constraint on tokens: per-state token masks and the rows that walk them.

A token is allowed in a state when walking its bytes never reaches the dead state (so what is
written can still be completed into a match); an EOS id when the state accepts. Masks are
computed the first time a state is reached, with one vectorized walk of every token that is
still alive, and kept packed (one bit a token) for the life of the compiled constraint.

A state where no token can go on and the output does not match (only bytes no token holds
could complete it) allows EOS: the output ends there, and `accepts` says it did not match.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass

import numpy as np

from engine.constrain.dfa import Dfa
from engine.constrain.vocabulary import DEAD, Vocabulary
from engine.errors import InvalidInput

_ids = itertools.count()
ENDED = -1  # a row's state key after its EOS
MOVES_HELD = 1 << 16  # memoised (state, token) moves per automaton
MOVE_BYTES = 100  # what one memoised move costs in a dict of ints (counted in nbytes)


@dataclass(frozen=True)
class Mask:
    packed: np.ndarray  # uint8, np.packbits of the bool mask
    continues: bool  # some non-EOS token is allowed


class Automaton:
    """A compiled constraint: its DFA and the masks of the states reached so far."""

    def __init__(self, dfa: Dfa, vocabulary: Vocabulary, field: str) -> None:
        self.dfa = dfa
        self.vocabulary = vocabulary
        self.field = field
        self.uid = next(_ids)
        self._flat = dfa.table.ravel()
        self._masks: dict[int, Mask] = {}
        self._mask_bytes = 0  # kept as masks are added: other threads read nbytes while rows add them
        self._lock = threading.Lock()
        # (state, token) -> the state after it, for allowed tokens already walked: a served schema's
        # rows take the same transitions over and over, and a hit skips both the allowed check and
        # the byte walk. Bounded: cleared when full.
        self._moves: dict[int, int] = {}
        self._ended = self._pack(self._eos_only(), continues=False)

    def start(self) -> AutomatonRow:
        return AutomatonRow(self, 1)

    @property
    def nbytes(self) -> int:
        return self.dfa.nbytes + self._mask_bytes + len(self._moves) * MOVE_BYTES

    @property
    def masks_cached(self) -> int:
        return len(self._masks)

    def mask(self, state: int) -> Mask:
        if state == ENDED:
            return self._ended
        found = self._masks.get(state)
        if found is None:
            found = self._compute(state)
            with self._lock:
                if state not in self._masks:
                    self._masks[state] = found
                    self._mask_bytes += found.packed.nbytes
                found = self._masks[state]
        return found

    def warm(self, stop: threading.Event | None = None) -> int:
        """Compute the mask of every live state not cached yet, so rows never wait for one (the
        server runs it on a thread of its own after compiling); `stop` ends it early. The number
        computed."""
        computed = 0
        for state in range(1, len(self.dfa.accepting)):
            if stop is not None and stop.is_set():
                break
            if state not in self._masks:
                self.mask(state)
                computed += 1
        return computed

    def move(self, state: int, token: int) -> int:
        """The state after `token` from `state`, where the state's mask allows it (InvalidInput
        otherwise); memoised."""
        size = self.vocabulary.size
        if 0 <= token < size:  # first: the key is unique only for ids in the vocabulary
            found = self._moves.get(state * size + token)
            if found is not None:
                return found
        if not 0 <= token < size or not _bit(self.mask(state).packed, token):
            raise InvalidInput(
                f"token {token} is not allowed by the constraint here",
                reason="TOKEN_NOT_ALLOWED",
                field=self.field,
            )
        after = state if token in self.vocabulary.eos_ids else self.walk(state, token)
        if len(self._moves) >= MOVES_HELD:
            self._moves.clear()
        self._moves[state * size + token] = after
        return after

    @property
    def initial(self) -> int:
        """The start state, for `after_bytes` (a walk by bytes, whatever tokens would write them)."""
        return 1

    def after_bytes(self, state: int, data: bytes) -> int | None:
        """The state after `data`'s bytes from `state`; None where they cannot follow."""
        table = self.dfa.table
        for byte in data:
            state = int(table[state, byte])
        return state or None

    def final(self, state: int) -> bool:
        return bool(self.dfa.accepting[state])

    def matches(self, data: bytes) -> bool:
        """Whether `data` is a whole match (the bytes alone, whatever tokens would write them)."""
        state = self.after_bytes(self.initial, data)
        return state is not None and self.final(state)

    def walk(self, state: int, token: int) -> int:
        """The state after `token`'s bytes (dead: 0)."""
        table = self.dfa.table
        for byte in self.vocabulary.pieces[token] or b"":
            state = int(table[state, byte])
        return state

    def _compute(self, state: int) -> Mask:
        mask = np.zeros(self.vocabulary.size, dtype=bool)
        mask[self._alive_tokens(state)] = True
        continues = bool(mask.any())
        accepting = bool(self.dfa.accepting[state])
        mask[list(self.vocabulary.eos_ids)] = accepting or not continues
        return self._pack(mask, continues)

    def _alive_tokens(self, state: int) -> np.ndarray:
        """Ids of the tokens whose bytes, walked from `state`, never reach the dead state."""
        layout, flat = self.vocabulary.layout, self._flat
        ends = layout.ends(state, lambda states, column: flat[states * 256 + column])
        alive: np.ndarray = layout.order[ends != DEAD]
        return alive

    def _eos_only(self) -> np.ndarray:
        mask = np.zeros(self.vocabulary.size, dtype=bool)
        mask[list(self.vocabulary.eos_ids)] = True
        return mask

    @staticmethod
    def _pack(mask: np.ndarray, continues: bool) -> Mask:
        packed = np.packbits(mask)
        packed.flags.writeable = False
        return Mask(packed, continues)


class AutomatonRow:
    """One generated sequence's place in an Automaton (engine.constrain's RowState)."""

    __slots__ = ("automaton", "state", "ended")

    def __init__(self, automaton: Automaton, state: int, ended: bool = False) -> None:
        self.automaton = automaton
        self.state = state
        self.ended = ended

    def allowed(self) -> np.ndarray:
        """A fresh bool array of vocabulary.size."""
        packed = self.automaton.mask(self._key_state).packed
        return np.unpackbits(packed, count=self.automaton.vocabulary.size).view(bool)

    @property
    def state_key(self) -> tuple[int, int]:
        return (self.automaton.uid, self._key_state)

    @property
    def done(self) -> bool:
        return self.ended or not self.automaton.mask(self.state).continues

    @property
    def accepts(self) -> bool:
        return bool(self.automaton.dfa.accepting[self.state])

    def advance(self, token: int) -> None:
        after = self.automaton.move(self._key_state, token)  # raises where the token is not allowed
        if token in self.automaton.vocabulary.eos_ids:
            self.ended = True
        else:
            self.state = after

    def copy(self) -> AutomatonRow:
        return AutomatonRow(self.automaton, self.state, self.ended)

    @property
    def _key_state(self) -> int:
        return ENDED if self.ended else self.state


def _bit(packed: np.ndarray, index: int) -> bool:
    return bool(packed[index >> 3] >> (7 - (index & 7)) & 1)
