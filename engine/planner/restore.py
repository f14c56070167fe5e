"""Which rows a session computes again so that its rows come out as a fresh run's.

A row's numerics follow the shape of the forward that computed it: int4 MatMulNBits
takes another kernel at one row (up to 0.7 nats), fp16 kernels change with the batch
width. A fresh run prefills a prompt in the spans of `chunk_spans`, so every prompt
row is computed in a multi-row forward. A session remembers `fresh`: how many of its
leading rows were written as a fresh run writes them. Positions a decode step wrote
are not fresh; rows of a partial chunk are fresh only in the default mode.

- Default mode: the row whose logits are kept is computed in a multi-row forward
  (two rows at least), beside rows written as a fresh run writes them: greedy
  tokens equal a fresh run's, log-probabilities agree to rounding (~1e-6).
- Deterministic mode: the forwards are the fresh run's own (same past, rows and
  width), so tokens and log-probabilities are bit-equal to a fresh run's. A backend
  whose rows follow the forward's exact width (CUDA) takes this rule in every mode
  (`deterministic=True` here): on the H200 the default rule's two-row re-runs parted
  from a fresh run's greedy tokens over held prefixes of 1,100-2,000 tokens.
"""

from __future__ import annotations

from engine.planner.plan import chunk_spans


def last_span_start(length: int, chunk: int) -> int:
    """Where the last forward of a fresh run of `length` tokens starts."""
    spans = chunk_spans(length, chunk)
    return spans[-1][0] if spans else 0


def recompute_from(held: int, fresh: int, target: int, chunk: int, deterministic: bool) -> int:
    """The first position a session holding `held` rows (the first `fresh` of them written as a
    fresh run writes them) computes, so that it holds `target` >= `held` rows with a fresh run's
    next-token logits. `target == held` is a restore (rewind, a shorter fork): its last row again."""
    if target <= 1:
        return 0
    if deterministic:
        settled = min(held, fresh)
        last = last_span_start(target, chunk)
        if last <= settled:
            return last
        return settled // chunk * chunk if chunk > 0 else 0
    if target == held:  # a restore: decode-written rows it keeps are computed as a fresh run would
        return min(fresh, target - 2)
    return min(held, target - 2)  # an extension continues after what the session holds


def fresh_after(fresh: int, past: int, rows: int, width: int, chunk: int, deterministic: bool) -> int:
    """`fresh` after a prefill forward of `rows` real rows at `width` on top of `past`: it grows when
    the forward joins the fresh rows and is one a fresh run would also make for them."""
    if past > fresh or rows < 2:
        return fresh
    if deterministic and not (chunk > 0 and width == chunk and past % chunk == 0):
        return fresh  # a partial chunk runs at another width once the prompt grows
    return max(fresh, past + rows)
