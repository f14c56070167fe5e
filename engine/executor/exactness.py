"""The exactness rules the engine follows (docs/api.md "Exactness"), as one value: measured on this
machine's kernels when the model loads (engine/executor/kernels.py), or assumed from the backend."""

from __future__ import annotations

from dataclasses import dataclass

SPECULATION_TOLERANCE = 1e-3  # nats: fp32 kernels part by ~3e-5 between one and several rows


@dataclass(frozen=True)
class KernelRules:
    """The rules the engine follows, and whether they come from a measurement on this machine."""

    fresh_forwards: bool  # re-runs follow a fresh run's own forwards (else: re-run the last two rows)
    least_decode_batch: int  # the narrowest decode forward, in pool rows
    measured: bool  # False: assumed from the backend (CUDA, an unbatched model, a probe not run)
    one_row_gap: float = 0.0  # the largest logit gap between a decode row alone and beside another
    re_run_gap: float = 0.0  # the largest logit gap between a prompt row and its two-row re-run
    verify_gap: float | None = None  # ... between a decode row and a verification row (None: not measured)

    @property
    def speculation_exact(self) -> bool:
        """Whether a verification forward's rows are a decode step's, within SPECULATION_TOLERANCE:
        then speculation (`--speculate auto`) changes no greedy token but where two logits tie."""
        return self.verify_gap is not None and self.verify_gap <= SPECULATION_TOLERANCE

    @property
    def restore_rule(self) -> str:
        return "fresh_forwards" if self.fresh_forwards else "two_rows"


def assumed(rows_follow_width: bool) -> KernelRules:
    """The rules a backend states without a measurement."""
    return KernelRules(fresh_forwards=rows_follow_width, least_decode_batch=1, measured=False)
