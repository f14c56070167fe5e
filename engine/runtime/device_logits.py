"""Next-token logits on the device, the CUDA backend's half that keeps and reads them.

Each pool row's logits are kept in a device store where the forward computed them; greedy tokens
(with a constraint's mask and the penalties) are chosen there in one argmax for every row, and
log-probabilities are computed there, so only token ids and a few values reach the host. Seeded
sampling reads its one row back and draws on the host, exactly as on CPU. `CudaBackend` inherits
this; the attributes below are set when it allocates the pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.runtime.cuda_runtime import Placement
from engine.runtime.greedy import GreedyRows
from engine.runtime.masks import MaskTable
from engine.sampling import (
    Sampler,
    TokenLogprobs,
    apply_presence_frequency,
    apply_repetition_penalty,
    log_probs,
    token_logprobs,
)


class DeviceLogits:
    rt: Placement
    xp: Any
    store: Any  # [rows, vocab]: each pool row's next-token logits
    gathered: Any  # scratch of the store's shape for gathered rows
    greedy: GreedyRows
    masks: MaskTable
    queued: bool  # device work is queued that the next forward must wait for

    def keep_row(self, row: int, logits: Any, index: int) -> None:
        with self.rt.enter():
            self.store[row] = logits[0, index]
        self.queued = True

    def keep_batch(self, rows: Sequence[int], logits: Any) -> None:
        with self.rt.enter():
            index = self._index(rows)
            source = logits[index, 0] if isinstance(index, slice) else self._gather(logits[:, 0], index)
            self.store[index] = source
        self.queued = True

    def _gather(self, source: Any, index: Any) -> Any:
        out = self.gathered[:len(index)]
        self.xp.take(source, index, axis=0, out=out)
        return out

    def _index(self, rows: Sequence[int]) -> Any:
        """Rows as a slice when they run in order without gaps (no index upload, no gather)."""
        if rows and list(rows) == list(range(rows[0], rows[0] + len(rows))):
            return slice(rows[0], rows[0] + len(rows))
        return self.xp.asarray(np.asarray(rows, np.int64))

    def choose(self, rows: Sequence[int], samplers: Sequence[Sampler],
               histories: Sequence[Sequence[int]]) -> list[int]:
        """Greedy rows in one argmax on the device; a penalty is applied there; sampling on the host."""
        out: dict[int, int] = {}
        plain = [i for i, s in enumerate(samplers) if s.params.greedy and not s.params.penalized]
        with self.rt.enter():
            if plain:  # one masked argmax for every row, constrained or not
                slots = [self.masks.slot(samplers[i]) if samplers[i].constrained else -1 for i in plain]
                picked = self.greedy(self.store, [rows[i] for i in plain], slots, self.masks.table)
                out.update(zip(plain, picked, strict=True))
            for i, sampler in enumerate(samplers):
                if i not in out:
                    out[i] = self._choose_one(rows[i], sampler, histories[i])
        return [out[i] for i in range(len(rows))]

    def _choose_one(self, row: int, sampler: Sampler, history: Sequence[int]) -> int:
        params = sampler.params
        if not params.greedy:
            # Seeded sampling draws on the host from this one row, exactly as on CPU.
            return sampler(self.row_logits(row), history)
        # The host's formulas (engine.sampling), run where the logits are.
        logits = self.store[row]
        if sampler.constraint is not None:
            logits = self.xp.where(self.masks.row(sampler), logits, self.xp.float32(-np.inf))
        logits = apply_repetition_penalty(logits, history, params.repetition_penalty, self.xp)
        logits = apply_presence_frequency(logits, sampler.counts, params.presence_penalty,
                                          params.frequency_penalty, self.xp)
        return int(self.xp.argmax(logits))

    def logprobs(self, rows: Sequence[int], tokens: Sequence[int], top: int,
                 allowed: Sequence[np.ndarray | None] = ()) -> list[TokenLogprobs]:
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
            return self._logprobs_on_device(logits[0, :len(tokens)], tokens, top)

    def _logprobs_on_device(self, logits: Any, tokens: Sequence[int], top: int) -> list[TokenLogprobs]:
        """Inside the runtime's context: log_probs where `logits` live, then only the small arrays move."""
        picked = self.xp.asarray(np.asarray(tokens, np.int64))
        chosen, ids, values = log_probs(self.xp, logits, picked, top)
        host = [None if a is None else self.rt.to_host(a) for a in (ids, values)]
        return token_logprobs(tokens, self.rt.to_host(chosen), host[0], host[1])

    def row_logits(self, row: int) -> np.ndarray:
        with self.rt.enter():
            return self.rt.to_host(self.store[row])
