"""What the engine asks of a backend (CPU, CUDA): one typed Protocol, no probing.

A backend owns the KV pool's buffers, the variants (everything prepared for
one forward shape), the logits store (each pool row's next-token logits,
kept where they were computed) and choosing tokens from it on its device.
The engine owns every decision: which rows, which widths, lengths and masks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

from engine.runtime.pool import KvPool
from engine.runtime.variants import Variant, VariantKey
from engine.sampling import Sampler, TokenLogprobs

VariantT = TypeVar("VariantT", bound=Variant)


@dataclass(frozen=True)
class HeadRows:
    """What a prefill forward hands back: logits [1, rows returned, vocab], kept where they were
    computed, and on a graph that gathers the rows it reads before its head (engine/head.py),
    `seen`: the head-input row each logits row came from, then the last row the head's input had."""

    logits: Any
    seen: np.ndarray | None = None

    def saw_real_row(self, rows: int, width: int) -> bool:
        """The head saw the planner's last real row of a forward `width` rows wide (`rows` real)."""
        if self.seen is None:  # every query row reaches the head: all of them must come back
            return int(self.logits.shape[1]) >= width
        return int(self.seen[-1]) == width - 1 and rows - 1 in self.seen[:-1].tolist()

    def last_real(self, rows: int) -> int:
        """The logits row of the last real row (a decoder that returns fewer rows: its last one)."""
        if self.seen is None:
            return min(rows, int(self.logits.shape[1])) - 1
        wanted = min(rows - 1, int(self.seen[-1]))
        return int(np.argmax(self.seen[:-1] == wanted))


@dataclass(frozen=True)
class ParkedRow:
    """A session's KV positions [0, length) and its stored next-token logits, off the pool: where
    the backend keeps them (host memory on CPU, device memory on CUDA), bit for bit."""

    kv: Any  # [layers, 2, kv_heads, length, head_size]
    logits: Any  # [vocab]

    @property
    def nbytes(self) -> int:
        return int(self.kv.nbytes) + int(self.logits.nbytes)

    @property
    def on_device(self) -> bool:
        """Whether the copy is in device memory (host memory is numpy's: pinned on CUDA)."""
        return not isinstance(self.kv, np.ndarray)


class Backend(Protocol[VariantT]):
    name: str
    evictable: bool  # False: a prepared variant cannot be released (CUDA graphs)
    weights_bytes: int  # 0: unknown, the engine counts the model's files
    async_capable: bool  # run_batch(wait=False) returns before the forward has finished
    # chain_batch can queue a step's greedy choice and the next forward behind the forward in flight
    chains: bool
    # A row's arithmetic depends on the forward's exact width (CUDA's GEMMs choose kernels by the
    # row count), not only on one row against several (MatMulNBits on CPU): prefill re-runs and
    # shared prefixes then follow a fresh run's own forwards in every mode (engine.planner.restore).
    rows_follow_width: bool
    # A decode forward over rows [0, B) commits the memory of every one of them, held or free (CPU
    # attention touches each row it runs over in full): warm-up then prepares a batch wider than
    # one without running it, so starting does not commit the whole pool.
    batch_commits_rows: bool
    # The most new prompts one prefill forward can take (`run_prompts`); 1: each prefills alone.
    prompt_batch: int
    # KV rows at full capacity the backend allocates beside the pool (CUDA: the staging row prefill
    # variants bind); the memory budget counts them.
    staging_rows: int
    # Called just before each forward enters onnxruntime, which runs without the interpreter (the
    # scheduler wakes its event loops there: engine.executor.step.Driven.before_forward).
    before_forward: Callable[[], None] | None

    def allocate(self, rows: int, capacity: int) -> KvPool:
        """The KV pool and the logits store, once, before any forward."""
        ...

    def prepare(self, key: VariantKey) -> VariantT:
        """Buffers (and on CUDA a graph to capture) for one forward shape."""
        ...

    def run_rows(
        self,
        variant: VariantT | None,
        key: VariantKey,
        row: int,
        past: int,
        feed: np.ndarray,
        ports: Mapping[str, np.ndarray],
        constants: Mapping[str, np.ndarray],
        read: np.ndarray,
    ) -> HeadRows:
        """One forward of `key.width` rows on top of `past` tokens of pool row `row` (its mask says
        past + width); None runs eagerly. `read` [key.reads]: the query rows the head reads, on a
        graph that takes them (else every row reaches it)."""
        ...

    def allocate_prompts(self, prompts: int, positions: int) -> int:
        """The staging block `run_prompts` binds, once, after `allocate`: its bytes."""
        ...

    def run_prompts(
        self,
        variant: VariantT | None,
        key: VariantKey,
        rows: Sequence[int],
        feed: np.ndarray,
        read: np.ndarray,
    ) -> HeadRows:
        """One forward of the first `key.width` rows of each of several new prompts (no past), prompt
        i (`feed[i]`) to pool row rows[i]; logits [key.prompts, key.reads, vocab]. Only where
        `prompt_batch` > 1."""
        ...

    def run_batch(
        self,
        variant: VariantT | None,
        key: VariantKey,
        ids: np.ndarray,
        positions: np.ndarray,
        wait: bool = True,
    ) -> Any:
        """One decode forward over pool rows [0, key.batch) feeding `ids` [B, 1] at `positions`
        [B, 1] (each row's mask says position + 1). Returns logits [B, 1, vocab]; with `wait`
        False they are ready only after `settle`."""
        ...

    def chain_batch(
        self,
        variant: VariantT | None,
        key: VariantKey,
        rows: Sequence[int],
        logits: Any,
        grow: Sequence[int],
        samplers: Sequence[Sampler],
    ) -> list[int] | None:
        """Behind the decode forward in flight that computes `logits`, without waiting for it: keep
        rows' logits, choose each row's token with its sampler (`Sampler.plain`: no constraint,
        penalty or log-probabilities; greedy or drawn at position grow[i]), feed it to the
        next forward over rows [0, key.batch) at position grow[i] (row rows[i]'s mask one longer,
        every other row's as it is) and launch that forward without waiting. The tokens, once
        chosen; None when the variant cannot be launched so (nothing was done). Only where `chains`."""
        ...

    def settle(self) -> None:
        """Wait for a forward launched without waiting (no-op when none is in flight)."""
        ...

    def keep_row(self, row: int, logits: Any, index: int) -> None:
        """Store logits[0, index] as pool row `row`'s next-token logits."""
        ...

    def keep_batch(self, rows: Sequence[int], logits: Any) -> None:
        """Store logits[r, 0] as row r's next-token logits, for each r in `rows`."""
        ...

    def choose(
        self, rows: Sequence[int], samplers: Sequence[Sampler], histories: Sequence[Sequence[int]]
    ) -> list[int]:
        """One token per row from its stored logits, chosen where the logits live."""
        ...

    def logprobs(
        self, rows: Sequence[int], tokens: Sequence[int], top: int, allowed: Sequence[np.ndarray | None] = ()
    ) -> list[TokenLogprobs]:
        """Log-softmax of each row's stored (raw) logits, computed where they live: each row's token's
        log-probability and its `top` most likely alternatives; only those values reach the host.
        A row with an `allowed` mask (structured output) is of the constrained distribution: the
        tokens it does not allow are left out before the softmax."""
        ...

    def prompt_logprobs(self, logits: Any, tokens: Sequence[int], top: int) -> list[TokenLogprobs]:
        """The same of a prefill forward's logits [1, rows, vocab]: row i against tokens[i], for the
        first len(tokens) rows (real rows: padded ones come after them)."""
        ...

    def row_logits(self, row: int) -> np.ndarray:
        """A host copy of one row's stored logits [vocab]."""
        ...

    def copy_rows(self, src: int, dst: int, length: int) -> None:
        """Copy positions [0, length) of pool row `src`'s KV (and its stored logits) to row `dst`,
        on the device that holds them: no forward is run."""
        ...

    def clear_state(self, row: int) -> None:
        """Zero a row's recurrent state (no-op without one)."""
        ...

    def park_row(self, row: int, length: int) -> ParkedRow:
        """A copy of positions [0, length) of pool row `row`'s KV and of its stored logits."""
        ...

    def unpark_row(self, row: int, parked: ParkedRow) -> None:
        """Write a parked copy back into pool row `row` (any row: positions carry no row)."""
        ...

    def spill_row(self, parked: ParkedRow) -> ParkedRow:
        """A parked copy in device memory moved to host memory (pinned: unparking is one copy), the
        device's copy freed once dropped; a copy in host memory already is returned as it is."""
        ...

    def release_row(self, row: int) -> None:
        """Give a row nobody holds back to the system where memory is committed by touch (CPU)."""
        ...

    def memory(self) -> dict[str, int]:
        """Backend-specific counters for stats (bytes by owner, captures, copies)."""
        ...

    def free_device_bytes(self) -> int | None:
        """Device memory free now, where parked sessions would live; None where that is host memory."""
        ...
