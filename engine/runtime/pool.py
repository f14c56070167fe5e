"""The KV slot pool: every session's KV as one row of a block per layer, and its attention mask.

Per layer one key and one value block `[rows, kv_heads, capacity, head_size]`
shared by past and present; a session owns one row. A prefill binds its own
row as a batch-1 view, a decode forward binds the first B rows, so no KV is
ever copied to batch sessions together. The mask `[rows, capacity]` says
each row's length (ones before, zeros after): `seqlens_k` comes from it and
`total_sequence_length` (its width) never changes.

Written against an array module (numpy on CPU, cupy on CUDA); the mask is a
host array either way (pinned memory the device reads in place on CUDA), so
moving a row's length is a few host stores.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # the engine's sessions; the pool only writes their length
    from engine.executor.session import Session


class KvPool:
    def __init__(self, xp: Any, *, layers: int, rows: int, kv_heads: int, capacity: int,
                 head_size: int, dtype: Any,
                 host_zeros: Callable[[tuple[int, ...], Any], Any] | None = None) -> None:
        self.xp = xp
        self.rows = rows
        self.capacity = capacity
        # Zeros: on CPU the pages are only committed as rows are written.
        self.block = xp.zeros((layers, 2, rows, kv_heads, capacity, head_size), dtype)
        self.mask = (host_zeros or np.zeros)((rows, capacity), np.int64)
        self.mask_lengths = [0] * rows

    @property
    def nbytes(self) -> int:
        return int(self.block.nbytes) + int(self.mask.nbytes)

    @property
    def row_bytes(self) -> int:
        return self.nbytes // max(self.rows, 1)

    def layer(self, index: int, which: int) -> Any:
        """The key (0) or value (1) block of one layer: contiguous, so its first B rows are too."""
        return self.block[index, which]

    def set_mask(self, row: int, length: int) -> None:
        """Move one row's mask boundary to `length` (a forward's width, a row no session owns)."""
        move_boundary(self.mask, row, self.mask_lengths[row], length)
        self.mask_lengths[row] = length

    def commit(self, session: Session, length: int) -> None:
        """The one writer of a session's length: the tokens its KV holds, and its row's mask with it."""
        session.length = length
        self.set_mask(session.row, length)


def move_boundary(mask: Any, row: int, old: int, new: int) -> None:
    """Move row `row` of a 0/1 mask from ones before `old` to ones before `new`, touching only
    the positions that change."""
    if new > old:
        mask[row, old:new] = 1
    elif new < old:
        mask[row, new:old] = 0
