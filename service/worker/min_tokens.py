"""min_tokens (vLLM's): a sample may not end before it has that many tokens.

The tokens that would end it (end-of-sequence, unless ignored, and the request's stop token ids) are
masked out of its first `min_tokens` choices, as vLLM's MinTokensLogitsProcessor does: the sampler
carries an EndsHeld as its constraint (the engine applies a constraint's mask on every backend, on
the host or the device), over the request's own constraint when it has one. Once the sample holds
`min_tokens` tokens, the body puts the request's constraint back (`released`), so the rest of the
sample runs as it would have without min_tokens (a plain sampler again, chained on the device).
Stop strings are not looked for before then either (service/front/stop_text.py, `armed`).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np

from engine.sampling import Constrained, Sampler
from service.calls import Stopping


class EndsHeld:
    """A sample's constraint while it is shorter than min_tokens: the request's constraint (or every
    token) less the tokens that would end the sample. Its states are keyed apart from the inner
    constraint's (the device's mask table caches a mask per state)."""

    def __init__(self, inner: Constrained | None, ends: frozenset[int], vocab_size: int) -> None:
        self.inner = inner
        self.ends = ends
        self._open = np.ones(vocab_size, bool)
        self._open[[t for t in ends if 0 <= t < vocab_size]] = False

    def allowed(self) -> np.ndarray:
        if self.inner is None:
            return self._open
        mask: np.ndarray = self.inner.allowed() & self._open
        return mask

    def advance(self, token: int) -> None:
        if self.inner is not None:
            self.inner.advance(token)

    @property
    def state_key(self) -> Hashable:
        inner = None if self.inner is None else (type(self.inner).__name__, self.inner.state_key)
        return self.ends, inner

    @property
    def done(self) -> bool:
        """The request's constraint is complete: nothing but its end may follow, so the sample ends
        even before min_tokens (the constraint's promise comes first)."""
        return self.inner is not None and self.inner.done


def ending_tokens(eos_ids: frozenset[int], stopping: Stopping, constrained: bool) -> frozenset[int]:
    """The tokens that end a sample: its stop token ids, and end-of-sequence unless ignore_eos (a
    constrained sample ends at end-of-sequence whatever ignore_eos says)."""
    eos = eos_ids if constrained or not stopping.ignore_eos else frozenset()
    return eos | stopping.stop_token_ids


def hold_ends(samplers: list[Sampler], min_tokens: int, ends: frozenset[int], vocab_size: int) -> None:
    """Give each sampler an EndsHeld over its constraint when the call asks for min_tokens."""
    if min_tokens < 1 or not ends:
        return
    for sampler in samplers:
        sampler.constraint = EndsHeld(sampler.constraint, ends, vocab_size)


def released(sampler: Sampler) -> None:
    """The sample holds min_tokens tokens: its own constraint (or none) from the next choice on."""
    if isinstance(sampler.constraint, EndsHeld):
        sampler.constraint = sampler.constraint.inner


def structured(sampler: Sampler) -> Any:
    """The request's own constraint of a sampler (None when it has none), through an EndsHeld."""
    constraint = sampler.constraint
    return constraint.inner if isinstance(constraint, EndsHeld) else constraint
