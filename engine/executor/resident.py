"""Fixed-address KV for graph variants: one resident KV block, sessions swapped in by device copies.

A captured CUDA graph replays against the addresses it was captured with, so
every variant binds one KV block and one attention mask: the home. The
session whose forward runs must be resident there. Switching sessions copies
the leaving session's valid prefix out to its own parking block and the
arriving session's prefix in: one strided copy each way, `length` positions
only, never the whole capacity. A session that stays resident pays nothing.

Written against an array module (cupy on CUDA, numpy in the CPU tests) so the
bookkeeping is tested without a GPU.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

_serials = itertools.count(1)


class ResidentSlot:
    """One session's KV: resident in the home, or parked in its own block."""

    def __init__(self, home: Home) -> None:
        self.home = home
        self.capacity = home.capacity
        self.length = 0
        self.parked: Any = None  # allocated at the first swap-out
        self.serial = next(_serials)

    @property
    def nbytes(self) -> int:
        # What a session costs the budget: one KV block at capacity (home or parking) and its mask.
        return int(self.home.block.nbytes + self.home.mask.nbytes)

    @property
    def resident(self) -> bool:
        return self.home.resident is self

    def set_length(self, length: int) -> None:
        self.length = length
        if self.resident:
            self.home.set_mask(length)

    def clear_state(self) -> None:
        """No recurrent state on this backend: nothing to clear."""


class Home:
    """The KV block [layers, 2, 1, kv_heads, capacity, head_size] and mask [1, capacity] variants bind."""

    def __init__(self, xp: Any, layers: int, kv_heads: int, capacity: int, head_size: int,
                 dtype: Any, host_zeros: Callable[[tuple[int, ...], Any], Any] | None = None) -> None:
        self.xp = xp
        self.capacity = capacity
        self.block = xp.zeros((layers, 2, 1, kv_heads, capacity, head_size), dtype)
        # The mask may live in host memory the device reads in place (see Runtime.host_zeros).
        self.mask = (host_zeros or xp.zeros)((1, capacity), np.int64)
        self.mask_len = 0  # the mask is ones on [0, mask_len) and zeros after
        self.in_flight = False  # a forward launched without waiting may still read the mask
        self.settle: Callable[[], None] = lambda: None  # waits for it; set by the backend
        self.queued = False  # cupy copies are queued that a forward must wait for
        self.resident: ResidentSlot | None = None
        self.swaps = 0
        self.swapped_positions = 0

    def layer(self, index: int, which: int) -> Any:
        """The key (0) or value (1) buffer of one layer: a contiguous view of the block."""
        return self.block[index, which]

    def set_mask(self, length: int) -> None:
        """Move the mask's boundary to `length`, touching only the positions that change."""
        if self.in_flight:
            self.settle()
        if length > self.mask_len:
            self.mask[0, self.mask_len:length] = 1
        elif length < self.mask_len:
            self.mask[0, length:self.mask_len] = 0
        self.mask_len = length

    def make_resident(self, slot: ResidentSlot) -> None:
        """Bring `slot`'s KV into the home, parking the current resident's valid prefix."""
        if self.resident is slot:
            return
        leaving = self.resident
        if leaving is not None and leaving.length:
            if leaving.parked is None:
                leaving.parked = self.xp.empty_like(self.block)
            leaving.parked[..., :leaving.length, :] = self.block[..., :leaving.length, :]
            self.swapped_positions += leaving.length
        if slot.parked is not None and slot.length:
            self.block[..., :slot.length, :] = slot.parked[..., :slot.length, :]
            self.swapped_positions += slot.length
        self.queued = bool(leaving is not None and leaving.length) or bool(slot.parked is not None
                                                                          and slot.length)
        self.resident = slot
        self.swaps += 1
        self.set_mask(slot.length)

    def parked_bytes(self, slots: list[ResidentSlot]) -> int:
        return sum(int(s.parked.nbytes) for s in slots if s.parked is not None)
