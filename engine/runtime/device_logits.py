"""Next-token logits on the device, the CUDA backend's half that keeps and reads them.

Each pool row's logits are kept in a device store where the forward computed them; greedy tokens
(with a constraint's mask and the penalties) are chosen there in one argmax for every row, and
log-probabilities are computed there, and sampled rows are drawn there in one kernel for every row
(engine.runtime.sampled), so only token ids and a few values reach the host. On numpy
(`host_runtime`) a sampled row is drawn on the host, as on CPU. `CudaBackend` inherits this; the
attributes below are set when it allocates the pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.runtime.cuda_runtime import Placement
from engine.runtime.greedy import GreedyRows
from engine.runtime.masks import MaskTable
from engine.runtime.sampled import SampledRows
from engine.sampling import (
    Sampler,
    TokenLogprobs,
    apply_presence_frequency,
    apply_repetition_penalty,
    log_probs,
    token_logprobs,
)

_INDEXES_HELD = 256  # row sets whose device index is kept (a few KB each at most)


class DeviceLogits:
    rt: Placement
    xp: Any
    store: Any  # [rows, vocab]: each pool row's next-token logits
    gathered: Any  # scratch of the store's shape for gathered rows
    greedy: GreedyRows
    sampled: SampledRows | None  # None on numpy: sampled rows draw on the host
    masks: MaskTable
    queued: bool  # device work is queued that the next forward must wait for
    indexes: dict[tuple[int, ...], Any]  # device indexes of row sets that are not one run (`_index`)

    def keep_row(self, row: int, logits: Any, index: int) -> None:
        with self.rt.enter():
            self.store[row] = logits[0, index]
        self.queued = True

    def keep_batch(self, rows: Sequence[int], logits: Any) -> None:
        """store[r] = logits[r, 0] for each row r (any order: the chain passes its rows in the step's
        order, and sorted, a compact batch is one slice copy: no index, no gather)."""
        with self.rt.enter():
            index = self._index(sorted(rows))
            source = logits[index, 0] if isinstance(index, slice) else self._gather(logits[:, 0], index)
            self.store[index] = source
        self.queued = True

    def _gather(self, source: Any, index: Any) -> Any:
        out = self.gathered[: len(index)]
        self.xp.take(source, index, axis=0, out=out)
        return out

    def _index(self, rows: Sequence[int]) -> Any:
        """Rows as a slice when they run in order without gaps (no index upload, no gather), else
        as an index on the device, uploaded once per set of rows: a decode batch keeps its rows for
        many steps, and an upload (cupy's asarray) was a fifth of the core's interpreter on the
        H100 (bench/results/token-level-sink-h100-2026-12-05). An index is never written once made,
        so one a queued kernel still reads may be handed out again."""
        if rows and list(rows) == list(range(rows[0], rows[0] + len(rows))):
            return slice(rows[0], rows[0] + len(rows))
        key = tuple(rows)
        index = self.indexes.get(key)
        if index is None:
            if len(self.indexes) >= _INDEXES_HELD:
                self.indexes.clear()  # rows churn: start over rather than track use
            index = self.indexes[key] = self.xp.asarray(np.asarray(rows, np.int64))
        return index

    def choose(
        self, rows: Sequence[int], samplers: Sequence[Sampler], histories: Sequence[Sequence[int]]
    ) -> list[int]:
        """Greedy rows in one argmax on the device, sampled rows in one draw there (penalties applied
        there first); greedy rows with a penalty one at a time, on the device too."""
        out: dict[int, int] = {}
        plain = [i for i, s in enumerate(samplers) if s.params.greedy and not s.params.penalized]
        drawn = [i for i, s in enumerate(samplers) if not s.params.greedy] if self.sampled is not None else []
        with self.rt.enter():
            if plain:  # one masked argmax for every row, constrained or not
                slots = [self.masks.slot(samplers[i]) if samplers[i].constrained else -1 for i in plain]
                picked = self.greedy(self.store, [rows[i] for i in plain], slots, self.masks.table)
                out.update(zip(plain, picked, strict=True))
            if drawn:
                out.update(
                    zip(
                        drawn,
                        self._draw(
                            [rows[i] for i in drawn],
                            [samplers[i] for i in drawn],
                            [histories[i] for i in drawn],
                        ),
                        strict=True,
                    )
                )
            for i, sampler in enumerate(samplers):
                if i not in out:
                    out[i] = self._choose_one(rows[i], sampler, histories[i])
        return [out[i] for i in range(len(rows))]

    def _draw(
        self, rows: Sequence[int], samplers: Sequence[Sampler], histories: Sequence[Sequence[int]]
    ) -> list[int]:
        """One kernel for every sampled row; a penalized row is first made as a float32 row of its
        own (the host's formulas, run where the logits are; the constraint's mask then applies in
        the kernel, which leaves the same tokens out as masking first would)."""
        assert self.sampled is not None
        addresses = self.row_addresses(rows)
        wide = [self.store.dtype == np.float32] * len(rows)
        made = []  # penalized rows, alive until the kernel has read them
        for i, (sampler, history) in enumerate(zip(samplers, histories, strict=True)):
            if sampler.params.penalized:
                logits = self._penalized(self.store[rows[i]], sampler, history)
                made.append(logits)
                addresses[i], wide[i] = logits.data.ptr, logits.dtype == np.float32
        slots = [self.masks.slot(s) if s.constrained else -1 for s in samplers]
        self.sampled.fill(
            0,
            addresses,
            wide,
            [s.params for s in samplers],
            [s.key for s in samplers],
            [len(h) for h in histories],
            slots,
        )
        tokens = self.sampled.chosen(len(rows), self.sampled.launch(len(rows), self.masks.table))
        del made
        return tokens

    def row_addresses(self, rows: Sequence[int]) -> list[int]:
        """The device address of each pool row's stored logits (no array made per row)."""
        base, stride = self.store.data.ptr, self.store.strides[0]
        return [base + row * stride for row in rows]

    def _penalized(self, logits: Any, sampler: Sampler, history: Sequence[int]) -> Any:
        params = sampler.params
        logits = apply_repetition_penalty(logits, history, params.repetition_penalty, self.xp)
        return apply_presence_frequency(
            logits, sampler.counts, params.presence_penalty, params.frequency_penalty, self.xp
        )

    def _choose_one(self, row: int, sampler: Sampler, history: Sequence[int]) -> int:
        params = sampler.params
        if not params.greedy:
            # On numpy (host_runtime): drawn on the host from this one row, exactly as on CPU.
            return sampler(self.row_logits(row), history)
        # The host's formulas (engine.sampling), run where the logits are.
        logits = self.store[row]
        if sampler.constraint is not None:
            logits = self.xp.where(self.masks.row(sampler), logits, self.xp.float32(-np.inf))
        return int(self.xp.argmax(self._penalized(logits, sampler, history)))

    def logprobs(
        self, rows: Sequence[int], tokens: Sequence[int], top: int, allowed: Sequence[np.ndarray | None] = ()
    ) -> list[TokenLogprobs]:
        """Log-softmax on the device; only each row's chosen value and `top` alternatives reach the host."""
        with self.rt.enter():
            index = self._index(rows)
            logits = self.store[index] if isinstance(index, slice) else self._gather(self.store, index)
            if any(mask is not None for mask in allowed):
                logits = logits.copy()
                for i, mask in enumerate(allowed):
                    if mask is not None:
                        logits[i] = self.xp.where(self.xp.asarray(mask), logits[i], self.xp.float32(-np.inf))
            return self._logprobs_on_device(logits, tokens, top)

    def prompt_logprobs(self, logits: Any, tokens: Sequence[int], top: int) -> list[TokenLogprobs]:
        with self.rt.enter():
            return self._logprobs_on_device(logits[0, : len(tokens)], tokens, top)

    def _logprobs_on_device(self, logits: Any, tokens: Sequence[int], top: int) -> list[TokenLogprobs]:
        """Inside the runtime's context: log_probs where `logits` live, then only the small arrays move."""
        picked = self.xp.asarray(np.asarray(tokens, np.int64))
        chosen, ids, values = log_probs(self.xp, logits, picked, top)
        host = [None if a is None else self.rt.to_host(a) for a in (ids, values)]
        return token_logprobs(tokens, self.rt.to_host(chosen), host[0], host[1])

    def row_logits(self, row: int) -> np.ndarray:
        with self.rt.enter():
            return self.rt.to_host(self.store[row])
