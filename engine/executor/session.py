"""A session: one sequence's KV slot, and the prefill plans carried out on it.

Each planned forward runs at its ladder width, its logits are cut back to the
real rows, and the session rewinds to past + real rows (mask tail cleared,
logical length rolled back) so padded KV is never read and is overwritten by
the next forward. The logits-row self-check turns padding off for the session
for good when a padded forward returns fewer rows than it was given.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import structlog

from engine.errors import InvalidInput, OutOfRange
from engine.executor.sampling import Sampler
from engine.planner import (
    CapacityExceeded,
    Forward,
    PaddingPolicy,
    PortShape,
    PrefillPlan,
    plan_prefill,
)

if TYPE_CHECKING:
    from engine.executor.engine import Engine

log = structlog.get_logger("ladder.engine")


@dataclass(frozen=True)
class ForwardReport:
    """What one forward did; the last report of a prefill carries the next-token logits."""

    forward: Forward
    width: int  # the width it actually ran at (exact after a self-check re-run)
    length: int  # tokens in the session after the forward
    logits: np.ndarray | None = None


@dataclass
class SessionStats:
    forwards: int = 0
    real_rows: int = 0
    padded_rows: int = 0
    self_check_reruns: int = 0


def widen(array: np.ndarray, rows: int, width: int) -> np.ndarray:
    """Pad axis 1 from `rows` to `width` by repeating the last real row."""
    if width == rows:
        return array
    tail = np.repeat(array[:, rows - 1:rows], width - rows, axis=1)
    return np.concatenate([array, tail], axis=1)


class Session:
    def __init__(self, engine: Engine, slot_index: int) -> None:
        self.engine = engine
        self.slot_index = slot_index
        self.slot = engine.slot(slot_index)
        self.length = 0
        self.tokens: list[int] = []
        self.padding_on = True
        self.stats = SessionStats()
        self.closed = False

    # -- planning -------------------------------------------------------------
    def plan(self, rows: int, ports: tuple[PortShape, ...] = ()) -> PrefillPlan:
        engine = self.engine
        policy = PaddingPolicy(enabled=engine.options.padding,
                               recurrent_state=engine.info.recurrent_state,
                               session_padding_on=self.padding_on)
        try:
            return plan_prefill(self.length, rows, engine.chunk_size, engine.limits, policy, ports)
        except CapacityExceeded as exc:
            raise OutOfRange(str(exc)) from exc

    # -- prefill ----------------------------------------------------------------
    def prefill(self, tokens: Sequence[int] | None = None, *, embeds: np.ndarray | None = None,
                ports: Mapping[str, np.ndarray] | None = None) -> Iterator[ForwardReport]:
        """Append a prompt, one forward per step; the last report carries the logits."""
        for forward, width, logits in self._steps(tokens, embeds, ports):
            last = logits is not None
            yield ForwardReport(forward, width, self.length,
                                self.engine.to_host(logits) if last else None)

    def next_token(self, sampler: Sampler, tokens: Sequence[int] | None = None, *,
                   embeds: np.ndarray | None = None, ports: Mapping[str, np.ndarray] | None = None,
                   history: Sequence[int] | None = None) -> int:
        """Append a prompt (or one decoded token) and choose the next token with `sampler`.

        Same token as `sampler(append(...), history)`, but the logits never leave the
        backend: on CUDA only the chosen token id crosses to the host.
        `history` (for the repetition penalty) defaults to the session's tokens.
        """
        row = None
        for _, _, logits in self._steps(tokens, embeds, ports):
            row = logits
        assert row is not None
        return self.engine.choose(row, sampler, self.tokens if history is None else history)

    def _steps(self, tokens: Sequence[int] | None, embeds: np.ndarray | None,
               ports: Mapping[str, np.ndarray] | None) -> Iterator[tuple[Forward, int, Any]]:
        """Run the plan; yields (forward, width, backend logits row of the last forward or None)."""
        feed, ids = self._feed(tokens, embeds)
        supplied = self._ports(ports or {})
        plan = self.plan(feed.shape[1], tuple(PortShape(n, a.shape) for n, a in supplied.items()))
        per_token = set(plan.padding.per_token_ports)
        streamed = {n: a for n, a in supplied.items() if n in per_token}
        constants = {n: a for n, a in supplied.items() if n not in per_token}
        for i, forward in enumerate(plan.forwards):
            stop = forward.start + forward.rows
            chunk_ports = {n: a[:, forward.start:stop] for n, a in streamed.items()}
            width, logits = self._run(forward, feed[:, forward.start:stop], chunk_ports, constants)
            if ids is not None:
                self.tokens.extend(ids[forward.start:stop])
            last = i == len(plan.forwards) - 1
            yield forward, width, logits if last else None

    def append(self, tokens: Sequence[int] | None = None, *, embeds: np.ndarray | None = None,
               ports: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
        """Append a prompt (or one decoded token) and return the next-token logits [vocab]."""
        reports = list(self.prefill(tokens, embeds=embeds, ports=ports))
        logits = reports[-1].logits
        assert logits is not None
        return logits

    def _run(self, forward: Forward, feed: np.ndarray, ports: Mapping[str, np.ndarray],
             constants: Mapping[str, np.ndarray]) -> tuple[int, np.ndarray]:
        width = forward.width if self.padding_on else forward.rows
        logits = self._forward(forward, width, feed, ports, constants)
        if width > forward.rows and logits.shape[1] < width:
            self._trip_self_check(forward, width, logits.shape[1])
            width = forward.rows
            logits = self._forward(forward, width, feed, ports, constants)
        rows = forward.rows
        self.stats.forwards += 1
        self.stats.real_rows += rows
        self.stats.padded_rows += width - rows
        # Cut to the real rows; a decoder that emits fewer rows gives its last one.
        last = logits[0, rows - 1] if logits.shape[1] >= rows else logits[0, -1]
        return width, last

    def _forward(self, forward: Forward, width: int, feed: np.ndarray,
                 ports: Mapping[str, np.ndarray], constants: Mapping[str, np.ndarray]) -> np.ndarray:
        rows = forward.rows
        wide = {n: widen(a, rows, width) for n, a in ports.items()}
        logits = self.engine.run_forward(self.slot, forward.past, widen(feed, rows, width),
                                         wide, constants)
        # Rewind: the padded rows' KV is erased from the logical length.
        self.length = forward.past + rows
        self.slot.set_length(self.length)
        return logits

    def _trip_self_check(self, forward: Forward, width: int, returned: int) -> None:
        self.padding_on = False
        self.stats.self_check_reruns += 1
        self.engine.note_padding_off()
        log.warning("padding_off_for_session", slot=self.slot_index, width=width,
                    logits_rows=returned, past=forward.past,
                    reason="decoder returned fewer logits rows than query rows")
        self.length = forward.past
        self.slot.set_length(forward.past)

    # -- validation -------------------------------------------------------------
    def _feed(self, tokens: Sequence[int] | None,
              embeds: np.ndarray | None) -> tuple[np.ndarray, list[int] | None]:
        info = self.engine.info
        if self.closed:
            raise InvalidInput("session is closed")
        if info.feed.name == "inputs_embeds":
            if embeds is None or embeds.ndim != 3 or embeds.shape[0] != 1 or embeds.shape[1] < 1:
                raise InvalidInput("this model is fed inputs_embeds shaped [1, rows, hidden]")
            return embeds.astype(self.engine.feed_dtype, copy=False), None
        if tokens is None or len(tokens) == 0:
            raise InvalidInput("a prompt needs at least one token")
        ids = [int(t) for t in tokens]
        bad = [t for t in ids if not 0 <= t < info.vocab_size]
        if bad:
            raise InvalidInput(f"token id {bad[0]} is outside the vocabulary of {info.vocab_size}")
        return np.asarray([ids], np.int64), ids

    def _ports(self, ports: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        dtypes = self.engine.port_dtypes
        unknown = sorted(set(ports) - set(dtypes))
        missing = sorted(set(dtypes) - set(ports))
        if unknown or missing:
            raise InvalidInput(f"ports: unknown {unknown}, missing {missing}")
        # Each port in the dtype the graph declares for it.
        return {n: np.asarray(a, dtype=dtypes[n]) for n, a in ports.items()}

    # -- rewind, reset, close ---------------------------------------------------
    def rewind_to(self, length: int) -> None:
        """Forget everything after the first `length` tokens."""
        if not 0 <= length <= self.length:
            raise InvalidInput(f"cannot rewind to {length}: the session holds {self.length}")
        if length == self.length:
            return
        if self.engine.info.recurrent_state and length != 0:
            raise InvalidInput("a decoder with recurrent state can only rewind to 0")
        if length == 0:
            self.slot.clear_state()
        self.length = length
        del self.tokens[length:]
        self.slot.set_length(length)

    def reset(self) -> None:
        self.rewind_to(0)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.engine.release_slot(self.slot_index)
