"""A prompt being appended to a session: its checked inputs and the forwards still to run.

The engine runs a PrefillTask one forward at a time (so a scheduler can put
other sessions' decode steps between its chunks); everything here is plain
values and array slicing, no onnxruntime.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from engine.errors import InvalidInput
from engine.executor.session import Session
from engine.model import ModelInfo
from engine.planner import Forward
from engine.sampling import TokenLogprobs


@dataclass(frozen=True)
class ForwardReport:
    """What one forward did."""

    forward: Forward
    width: int  # the width it actually ran at (exact after a self-check re-run)
    length: int  # tokens in the session after the forward


@dataclass
class PrefillTask:
    session: Session
    feed: np.ndarray  # [1, rows] token ids, or [1, rows, hidden] embeddings
    ids: list[int] | None  # the token ids (None when fed embeddings)
    streamed: dict[str, np.ndarray]  # per-token ports, widened with the feed
    constants: dict[str, np.ndarray]  # other supplied ports, bound as they are
    forwards: list[Forward] = field(default_factory=list)  # still to run, in order
    logprob_top: int | None = None  # prompt log-probabilities wanted, with this many alternatives
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # of ids[again + 1:], forward by forward
    again: int = 0  # leading rows the session held already, computed again (engine.planner.restore)

    @property
    def done(self) -> bool:
        return not self.forwards

    @property
    def rows(self) -> int:
        return int(self.feed.shape[1])

    def chunk(self, forward: Forward, width: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The feed and per-token ports of one forward, widened to `width`."""
        stop = forward.start + forward.rows
        ports = {n: widen(a[:, forward.start : stop], forward.rows, width) for n, a in self.streamed.items()}
        return widen(self.feed[:, forward.start : stop], forward.rows, width), ports


def read_index(rows: int, reads: int) -> np.ndarray:
    """The query rows the head reads: the last real row alone (reads 1), or the real rows in
    order with the last repeated to fill `reads` (the hook for per-row logits of a prompt)."""
    if reads == 1:
        return np.array([rows - 1], np.int64)
    return np.minimum(np.arange(reads, dtype=np.int64), rows - 1)


def widen(array: np.ndarray, rows: int, width: int) -> np.ndarray:
    """Pad axis 1 from `rows` to `width` by repeating the last real row."""
    if width == rows:
        return array
    tail = np.repeat(array[:, rows - 1 : rows], width - rows, axis=1)
    return np.concatenate([array, tail], axis=1)


def checked_feed(
    info: ModelInfo, feed_dtype: np.dtype, tokens: Sequence[int] | None, embeds: np.ndarray | None
) -> tuple[np.ndarray, list[int] | None]:
    """The feed array of a prompt given as token ids or embeddings, as the model takes it."""
    if info.feed.name == "inputs_embeds":
        if embeds is None or embeds.ndim != 3 or embeds.shape[0] != 1 or embeds.shape[1] < 1:
            raise InvalidInput("this model is fed inputs_embeds shaped [1, rows, hidden]")
        return embeds.astype(feed_dtype, copy=False), None
    if tokens is None or len(tokens) == 0:
        raise InvalidInput("a prompt needs at least one token")
    ids = [int(t) for t in tokens]
    check_ids(ids, info.vocab_size)
    return np.asarray([ids], np.int64), ids


def check_ids(ids: Sequence[int], vocab_size: int) -> None:
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise InvalidInput(f"token id {bad[0]} is outside the vocabulary of {vocab_size}")


def checked_ports(dtypes: Mapping[str, np.dtype], ports: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every port the graph declares, each in the dtype it declares; nothing unknown."""
    unknown = sorted(set(ports) - set(dtypes))
    missing = sorted(set(dtypes) - set(ports))
    if unknown or missing:
        raise InvalidInput(f"ports: unknown {unknown}, missing {missing}")
    return {n: np.asarray(a, dtype=dtypes[n]) for n, a in ports.items()}
