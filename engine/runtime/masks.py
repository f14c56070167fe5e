"""Structured output on a device: the allowed-token masks of constraint states in one device table,
so a step's constrained rows read theirs where they lie (engine.runtime.greedy, engine.runtime.sampled):
only slots cross. A mask is bit-packed as np.packbits writes it (token v is bit 7 - v % 8 of byte
v // 8), an eighth of a byte per token: 6 KiB a state on a 49k vocabulary, 16 KiB on a 128k one."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

import numpy as np

from engine.sampling import Sampler

MASKS_HELD = 256  # constraint states whose allowed-token masks stay on the device (a bit per token each)


class MaskTable:
    """The allowed-token masks of constraint states, on the device: one row per state (row 0 allows
    every token), filled the first time a state is chosen in and reused, least recently used first
    out. A step's greedy rows read theirs in the one argmax kernel (engine.runtime.greedy)."""

    def __init__(self, xp: Any, vocab: int, rows: int) -> None:
        self.xp = xp
        self.vocab = vocab
        self.rows = rows
        self.stride = (vocab + 7) // 8  # bytes a row's mask takes
        self.table: Any = None  # allocated on the first constrained choice
        self._slots: OrderedDict[Hashable, int] = OrderedDict()

    def slot(self, sampler: Sampler) -> int:
        constraint = sampler.constraint
        if constraint is None:
            return 0
        if self.table is None:
            self.table = self.xp.full((self.rows, self.stride), 0xFF, self.xp.uint8)
        key = (type(constraint).__name__, constraint.state_key)
        slot = self._slots.get(key)
        if slot is not None:
            self._slots.move_to_end(key)
            return slot
        if len(self._slots) < self.rows - 1:
            slot = len(self._slots) + 1
        else:
            slot = self._slots.popitem(last=False)[1]
        allowed = sampler.allowed()
        assert allowed is not None
        self.table[slot] = self.xp.asarray(np.packbits(allowed))
        self._slots[key] = slot
        return slot

    def row(self, sampler: Sampler) -> Any:
        """The sampler's allowed tokens as a bool vector on the device (unpacked from its slot)."""
        slot = self.slot(sampler)  # first: it allocates the table
        return unpacked(self.xp, self.table[slot], self.vocab)

    @property
    def nbytes(self) -> int:
        return 0 if self.table is None else int(self.table.nbytes)


def unpacked(xp: Any, packed: Any, vocab: int) -> Any:
    """Bit-packed masks (the table's rows, [..., stride]) as bools [..., vocab], on their device."""
    return xp.unpackbits(packed, axis=-1)[..., :vocab].astype(bool)
