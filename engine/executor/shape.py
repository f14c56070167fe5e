"""The engine's fixed geometry: what one model under one set of options plans its forwards with.

It is computed once, from the model's description and the options, when the engine is built, and
never changes after. The engine's parts read it (the session table, the prefill runner); the batch
widths are not part of it: the kernel rules measured after load may narrow them (`Engine.follow`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from engine.model import ModelInfo
from engine.options import EngineOptions
from engine.planner import Limits, chunk_width, ladder_widths
from engine.runtime.cpu import _dtype


@dataclass(frozen=True)
class EngineShape:
    """The model and options, the KV limits and capacity (positions a session may hold), the chunk
    width and the ladder of prefill widths (`padded_ladder`: the widths prefill forwards are padded
    onto, none when padding is off for the model), the dtypes of the feed and of each supplied
    port, and why decode cannot batch sessions ("" when it can)."""

    info: ModelInfo
    options: EngineOptions
    limits: Limits
    capacity: int
    chunk_size: int
    ladder: tuple[int, ...]
    padded_ladder: tuple[int, ...]
    feed_dtype: np.dtype
    port_dtypes: Mapping[str, np.dtype]
    unbatched_reason: str


def engine_shape(info: ModelInfo, options: EngineOptions) -> EngineShape:
    """The geometry of `info` under `options`."""
    limits = Limits(capacity=options.capacity or info.max_length, rotary_rows=info.rotary_rows)
    capacity = limits.reach
    chunk_size = chunk_width(info.chunk_size, options.chunk_size, capacity)
    ladder = ladder_widths(chunk_size)
    return EngineShape(
        info=info,
        options=options,
        limits=limits,
        capacity=capacity,
        chunk_size=chunk_size,
        ladder=ladder,
        padded_ladder=ladder if options.padding and not info.recurrent_state else (),
        feed_dtype=_dtype(info.feed.dtype),
        port_dtypes={p.name: _dtype(p.dtype) for p in info.supplied_ports},
        unbatched_reason=unbatched_reason(info),
    )


def unbatched_reason(info: ModelInfo) -> str:
    """Why this model's decode cannot batch sessions ("" when it can)."""
    if info.recurrent_state:
        return "the decoder carries recurrent state: each session decodes alone, exact"
    if info.supplied_ports or info.feed.name != "input_ids":
        return "the model takes inputs besides token ids: each session decodes alone"
    return ""
