"""What this machine's kernels do with a row, measured when the model loads, and the exactness
rules chosen from it (docs/api.md "Exactness").

onnxruntime's CPU kernels (MLAS) pick MatMulNBits and GEMM kernels by ISA and by row count, so a
rule written on one CPU need not hold on another: on an AVX2-only x86 a decode row run alone
differs from the same row beside another by over a nat, where AVX-512 gives the same row. Two
facts decide the rules, and both are measured on the loaded model, bit for bit:
- whether a decode row alone (batch width 1) equals the same row beside another (width 2);
  where it does not, decode forwards bind two rows at least, so a row's decode logits never
  depend on how many sessions decode beside it;
- whether a prompt row computed in one forward equals the same row re-run in a two-row forward
  over its past (the default restore rule); where it does not, re-runs and shared prefixes follow
  a fresh run's own forwards (engine.planner.restore, as the deterministic mode does).
A third is measured for speculative decoding (issue #44): how far a row of a verification forward
(a token and its draft, several query rows) lies from the same row run as a decode step. Where it
is 0, speculation's greedy output is a plain decode's token for token; int4 models on x86 CPUs
part by up to ~2 nats (`speculation_exact`): attention rounds a row a few 1e-8 apart beside a
draft's rows, and int8 activations turn that into whole quantization steps
(bench/results/verify-gap-origin-2026-12-05).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from engine.executor.decode import BatchDecoder
from engine.executor.exactness import KernelRules
from engine.executor.prefix import HeldPrefixes
from engine.executor.session import Session
from engine.model import ModelInfo
from engine.runtime.backend import Backend, HeadRows
from engine.runtime.pool import KvPool
from engine.runtime.variants import VariantCache


class Sessions(Protocol):
    """An engine's sessions as the load-time probe and the warm-up drive them."""

    info: ModelInfo
    backend: Backend[Any]
    pool: KvPool
    decoder: BatchDecoder
    variants: VariantCache[Any]
    prefixes: HeldPrefixes

    @property
    def free_rows(self) -> set[int]: ...

    def open_session(self, scope: str = "", prompt: Sequence[int] = ()) -> Session: ...

    def append(
        self,
        session: Session,
        tokens: Sequence[int] | None = None,
        *,
        embeds: np.ndarray | None = None,
        ports: Mapping[str, np.ndarray] | None = None,
    ) -> np.ndarray: ...

    def rewind(self, session: Session, length: int) -> None: ...

    def close_session(self, session: Session, keep: bool = True) -> None: ...


class Probed(Sessions, Protocol):
    """What the probe reads and restores besides: the counters users read, the verification forward."""

    sessions_padding_off: int
    eager_forwards: int

    @property
    def verifies(self) -> bool: ...

    def logits(self, session: Session) -> np.ndarray: ...

    def verify_forward(self, session: Session, ids: Sequence[int]) -> HeadRows | None: ...


PROBE_ROWS = 24  # a prompt that runs as one forward on every ladder (the narrowest rung is >= 16)


def measure(engine: Probed) -> KernelRules:
    """Run the probe forwards on sessions of an engine fresh from construction, and leave it as it
    was: the sessions closed, no variant prepared, no row's memory kept, the counters users read
    (sessions whose padding turned off, eager forwards, decode) as found."""
    counters = (engine.sessions_padding_off, engine.eager_forwards, copy.deepcopy(engine.decoder.counters))
    try:
        ids = probe_ids(engine.info.vocab_size)
        re_run_gap = _gap(_prompt_logits(engine, ids, split=0), _prompt_logits(engine, ids, split=2))
        one_row_gap = _one_row_gap(engine, ids) if engine.pool.rows >= 2 else 0.0
        least = 2 if one_row_gap > 0.0 else 1
        verify_gap = _verify_gap(engine, ids, least) if engine.verifies else None
    finally:
        engine.sessions_padding_off, engine.eager_forwards, engine.decoder.counters = counters
        engine.variants.reset()
        for row in engine.free_rows - engine.prefixes.held.keys():
            engine.backend.release_row(row)
    return KernelRules(
        fresh_forwards=re_run_gap > 0.0,
        least_decode_batch=2 if one_row_gap > 0.0 else 1,
        measured=True,
        one_row_gap=one_row_gap,
        re_run_gap=re_run_gap,
        verify_gap=verify_gap,
    )


def probe_ids(vocab: int) -> list[int]:
    """Token ids spread over the vocabulary (no tokenizer needed), the same on every load."""
    return [(7919 * i + 13) % vocab for i in range(PROBE_ROWS)]


def _prompt_logits(engine: Probed, ids: list[int], split: int) -> np.ndarray:
    """The next-token logits of `ids` prefilled whole (split 0) or with its last `split` rows apart."""
    session = engine.open_session()
    try:
        if split:
            engine.append(session, ids[:-split])
            return np.array(engine.append(session, ids[-split:]), np.float64)
        return np.array(engine.append(session, ids), np.float64)
    finally:
        engine.close_session(session, keep=False)


def _one_row_gap(engine: Probed, ids: list[int]) -> float:
    """The gap between a decode row's logits in a forward of one row and in one of two."""
    session = engine.open_session()
    try:
        engine.append(session, ids)
        found = []
        for least in (1, 2):
            engine.decoder.forward({session.row: ids[0]}, least=least)
            found.append(np.array(engine.logits(session), np.float64))
            engine.rewind(session, len(ids))
        return _gap(found[0], found[1])
    finally:
        engine.close_session(session, keep=False)


def _verify_gap(engine: Probed, ids: list[int], least: int) -> float | None:
    """The gap between the logits of two tokens decoded one step each and the same two rows of one
    verification forward (None: the head does not read a verification's rows back)."""
    session = engine.open_session()
    try:
        engine.append(session, ids[:-2])
        past, decoded = session.length, []
        for token in ids[-2:]:
            engine.decoder.forward({session.row: token}, least=least)
            decoded.append(np.array(engine.logits(session), np.float64))
        engine.rewind(session, past)
        out = engine.verify_forward(session, ids[-2:])
        if out is None:
            return None
        gaps = []
        for i in range(2):
            engine.backend.keep_row(session.row, out.logits, i)
            gaps.append(_gap(np.array(engine.backend.row_logits(session.row), np.float64), decoded[i]))
        return max(gaps)
    finally:
        engine.close_session(session, keep=False)


def _gap(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b)))
