"""A model's vocabulary as bytes, laid out for vectorized automaton walks.

Every token id maps to the bytes it stands for (byte-level BPE pieces through GPT-2's map,
SentencePiece `▁` as a space and `<0xNN>` byte fallback: engine/tokenizer.py does that
mapping). Special tokens and ids past the tokenizer's table (a logits row wider than the
vocabulary) never match text: they are `usable == False`; end-of-sequence ids are allowed only
where a constraint accepts (`eos_ids`).

`matrix[i, j]` is byte j of token i (0 past its end), `lengths[i]` its length: a walk of
every token through a transition table is `max(lengths)` numpy gathers, whatever the vocabulary
(`Layout.ends`, the one walk both constraint engines use: the DFA's and the pushdown grammar's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

DEAD = 0  # the state no byte leaves, in both engines' transition tables

# One byte column's step of a walk: (the states of the tokens still alive, their next bytes) ->
# the states after (DEAD where that byte cannot follow).
Step = Callable[[npt.NDArray[np.int32], npt.NDArray[np.uint8]], npt.NDArray[np.int32]]


@dataclass(frozen=True)
class Layout:
    """A vocabulary's usable tokens, longest first, by byte column: `columns[d]` holds byte d of
    every token longer than d, so those tokens are a prefix of `order`."""

    order: npt.NDArray[np.intp]
    lengths: npt.NDArray[np.int32]
    columns: tuple[npt.NDArray[np.uint8], ...]

    def ends(self, start: int, step: Step) -> npt.NDArray[np.int32]:
        """Where each usable token (in `order`) leads from state `start`, DEAD where a byte of it
        cannot follow. Only the tokens still alive go through `step`, a byte column at a time."""
        ends = np.zeros(len(self.order), np.int32)
        at = np.arange(len(self.order))
        current = np.full(len(at), start, np.int32)
        for depth, column in enumerate(self.columns):
            # `at` keeps the longest-first order: the tokens that end before this byte are its tail.
            longer = int(np.count_nonzero(self.lengths[at] > depth))
            ends[at[longer:]] = current[longer:]
            at, current = at[:longer], current[:longer]
            if not longer:
                break
            current = step(current, column[at])
            alive = np.flatnonzero(current != DEAD)
            at, current = at[alive], current[alive]
        ends[at] = current
        return ends


def walk(
    start: int, matrix: npt.NDArray[np.uint8], lengths: npt.NDArray[np.int32], step: Step
) -> npt.NDArray[np.int32]:
    """`Layout.ends` for any tokens, in any order (`matrix[i]`: token i's bytes, `lengths[i]`
    how many): where each leads from state `start`, DEAD where a byte of it cannot follow."""
    ends = np.zeros(len(lengths), np.int32)
    at = np.arange(len(lengths))
    current = np.full(len(at), start, np.int32)
    for depth in range(matrix.shape[1]):
        done = lengths[at] <= depth
        if done.any():
            ends[at[done]] = current[done]
            at, current = at[~done], current[~done]
        if not len(at):
            break
        current = step(current, matrix[at, depth])
        alive = np.flatnonzero(current != DEAD)
        at, current = at[alive], current[alive]
    ends[at] = current
    return ends


class Vocabulary:
    def __init__(self, pieces: Sequence[bytes | None], size: int, eos_ids: Iterable[int]) -> None:
        """`pieces[i]`: token i's bytes, None for a special token; `size`: the logits row width
        (>= len(pieces)); `eos_ids`: the ids that end a generation."""
        if size < len(pieces):
            raise ValueError(f"a logits row of {size} cannot hold a vocabulary of {len(pieces)}")
        self.size = size
        self.eos_ids = tuple(sorted(set(int(i) for i in eos_ids if 0 <= int(i) < size)))
        self.pieces: list[bytes | None] = [*pieces, *([None] * (size - len(pieces)))]
        self.usable = np.array([p is not None and len(p) > 0 for p in self.pieces], dtype=bool)
        self.usable[list(self.eos_ids)] = False
        self.lengths = np.array([len(p) if p else 0 for p in self.pieces], dtype=np.int32)
        width = int(self.lengths.max(initial=1))
        self.matrix = np.zeros((size, width), dtype=np.uint8)
        for i, piece in enumerate(self.pieces):
            if piece and self.usable[i]:
                self.matrix[i, : len(piece)] = np.frombuffer(piece, dtype=np.uint8)

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, size: int, eos_ids: Iterable[int]) -> Vocabulary:
        """From an engine.tokenizer.Tokenizer: its special (added) tokens are not text."""
        special = tokenizer.special_ids
        pieces = [None if i in special else tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
        return cls(pieces, size, eos_ids)

    @property
    def nbytes(self) -> int:
        return int(self.matrix.nbytes + self.lengths.nbytes + self.usable.nbytes)

    @cached_property
    def layout(self) -> Layout:
        """The usable tokens laid out for walks (`Layout`), built once per vocabulary."""
        ids = np.flatnonzero(self.usable)
        order = ids[np.argsort(-self.lengths[ids], kind="stable")]
        lengths = self.lengths[order]
        width = int(lengths.max(initial=0))
        columns = tuple(np.ascontiguousarray(self.matrix[order[lengths > d], d]) for d in range(width))
        return Layout(order, lengths, columns)
