"""A model's vocabulary as bytes, laid out for vectorized automaton walks.

Every token id maps to the bytes it stands for (byte-level BPE pieces through GPT-2's map,
SentencePiece `▁` as a space and `<0xNN>` byte fallback: engine/tokenizer.py does that
mapping). Special tokens and ids past the tokenizer's table (a logits row wider than the
vocabulary) never match text: they are `usable == False`; end-of-sequence ids are allowed only
where a constraint accepts (`eos_ids`).

`matrix[i, j]` is byte j of token i (0 past its end), `lengths[i]` its length: a walk of
every token through a transition table is `max(lengths)` numpy gathers, whatever the vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import cached_property
from typing import Any

import numpy as np


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
    def by_length(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The usable token ids longest first, their lengths, and their bytes column by column
        ([width, tokens], each column contiguous): what a mask walk reads
        (engine/constrain/automaton.py), built once per vocabulary."""
        ids = np.flatnonzero(self.usable)
        ids = ids[np.argsort(-self.lengths[ids], kind="stable")]
        return ids, self.lengths[ids], np.ascontiguousarray(self.matrix[ids].T)
