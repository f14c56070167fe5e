"""The staging row prefill variants bind on the CUDA backend (engine/runtime/cuda.py): one batch-1 KV
block and mask at fixed addresses, and which pool row's prefix it holds, so a prompt's chunks run as
graph replays whatever row its session has."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.runtime.pool import KvPool, move_boundary


class Staging:
    """The batch-1 KV block and mask prefill variants bind, and which pool row's prefix it holds."""

    def __init__(self, pool: KvPool, host_zeros: Any, copy: Any) -> None:
        xp = pool.xp
        self.block = xp.zeros((*pool.block.shape[:2], 1, *pool.block.shape[3:]), pool.block.dtype)
        self.mask = host_zeros((1, pool.capacity), np.int64)
        self.mask_len = 0
        self.row = -1
        self.valid = 0  # positions [0, valid) equal the pool row's
        self.copied_positions = 0
        self.copy = copy  # Placement.copy_positions

    def set_mask(self, length: int) -> None:
        move_boundary(self.mask, 0, self.mask_len, length)
        self.mask_len = length

    def load(self, pool: KvPool, row: int, past: int) -> bool:
        """Bring pool row `row`'s first `past` positions in; True when a copy was queued."""
        start = min(self.valid, past) if self.row == row else 0
        self.row, self.valid = row, past
        if start >= past:
            return False
        self.copy(self.block, 0, pool.block, row, start, past)
        self.copied_positions += past - start
        return True

    def store(self, pool: KvPool, start: int, stop: int) -> None:
        """Copy positions [start, stop) the forward wrote back to the pool row."""
        self.copy(pool.block, self.row, self.block, 0, start, stop)
        self.valid = stop
        self.copied_positions += stop - start

    def written(self, position: int) -> None:
        """The staged pool row changed at `position` (a decode step): the staging copy is good up to it."""
        self.valid = min(self.valid, position)

    def changed(self, row: int, position: int = 0) -> None:
        """Pool row `row` changed from `position` on (a copy into it, a decode step): if it is the
        staged row, the staging copy is good only up to there."""
        if row == self.row:
            self.written(position)
