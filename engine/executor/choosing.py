"""Choosing tokens from the logits the backend keeps for each pool row, and the log-probabilities
of each choice for the samplers that ask for them (`Engine.choose_rows` is this)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from engine.executor.session import Session
from engine.runtime.backend import Backend
from engine.sampling import Sampler


def choose_rows(
    backend: Backend[Any],
    most: int,
    sessions: Sequence[Session],
    samplers: Sequence[Sampler],
    picked: list[int] | None = None,
) -> list[int]:
    """Choose each session's next token (`picked`: already chosen on the device, the decode
    chain's); tell each sampler its choice and, when it asks, the log-probabilities of it (one
    batched computation on the backend for all that ask). More choices than `most` (the pool's
    rows: n samples' first tokens, one row read for several) go in turns of at most that many: the
    backend's buffers hold one per row."""
    if picked is None and len(sessions) > most:
        return [
            token
            for at in range(0, len(sessions), most)
            for token in choose_rows(backend, most, sessions[at : at + most], samplers[at : at + most])
        ]
    rows = [s.row for s in sessions]
    tokens = picked
    if tokens is None:
        tokens = backend.choose(rows, samplers, [s.tokens for s in sessions])
    asking = [i for i, s in enumerate(samplers) if s.top_logprobs is not None]
    if asking:
        top = max(samplers[i].top_logprobs or 0 for i in asking)
        masks = [samplers[i].allowed() for i in asking]  # before `chose` moves the constraint on
        found = backend.logprobs(
            [rows[i] for i in asking],
            [tokens[i] for i in asking],
            top,
            masks if any(m is not None for m in masks) else (),
        )
        for i, logprobs in zip(asking, found, strict=True):
            kept = logprobs.top[: samplers[i].top_logprobs]
            if samplers[i].constrained:  # alternatives the constraint rules out are not alternatives
                kept = tuple(pair for pair in kept if pair[1] > -math.inf)
            samplers[i].last = replace(logprobs, top=kept)
    for sampler, token in zip(samplers, tokens, strict=True):
        sampler.chose(token)
    return tokens
