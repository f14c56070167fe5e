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

import ctypes
import ctypes.util
import functools
import mmap
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # the engine's sessions; the pool only writes their length
    from engine.executor.session import Session


class KvPool:
    def __init__(
        self,
        xp: Any,
        *,
        layers: int,
        rows: int,
        kv_heads: int,
        capacity: int,
        head_size: int,
        dtype: Any,
        host_zeros: Callable[[tuple[int, ...], Any], Any] | None = None,
    ) -> None:
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

    def moved(self, row: int, length: int) -> None:
        """One row's mask was moved to `length` elsewhere (by the device, behind a forward): the
        host's record follows, so the next `set_mask` moves the boundary from there."""
        self.mask_lengths[row] = length

    def row_slabs(self, row: int) -> list[Any]:
        """Row `row` of every layer's key and value block: each one contiguous slab."""
        return [self.block[i, w, row] for i in range(self.block.shape[0]) for w in (0, 1)]

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


_MADV_DONTNEED = 4
_PAGE = mmap.PAGESIZE


@functools.cache
def _madvise() -> Callable[..., int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.madvise
    except (OSError, AttributeError):  # not Linux or no libc: rows stay committed
        return None


def release_pages(array: np.ndarray) -> int:
    """Hand the whole pages inside a contiguous host array back to the system (madvise DONTNEED):
    they read as zeros after, and cost no memory until written again. Pages shared with the
    array's neighbours are kept. The bytes released (0 where madvise is missing)."""
    madvise = _madvise()
    start, end = array.ctypes.data, array.ctypes.data + array.nbytes
    first, last = -(-start // _PAGE) * _PAGE, end // _PAGE * _PAGE
    if madvise is None or last <= first or not array.flags.c_contiguous:
        return 0
    if madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), _MADV_DONTNEED) != 0:
        return 0
    return last - first
