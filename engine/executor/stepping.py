"""Running one `Step`: the order a round's work runs in and how each item fails alone.

`run_step` is `Engine.step`'s body: session ops (Choose only queues its session), then opens, then
prefill spans (new prompts' first chunks of one width together), then one batched choice of every
first token the step asked for (Choose ops and prompts whose last forward ran), then one decode
forward for the decode rows. Each item's outcome is its value or its error; a failed item costs
no other item anything.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from engine.errors import InvalidInput
from engine.executor.prefill import ForwardReport, PrefillTask
from engine.executor.session import Session
from engine.executor.stats import EngineStats
from engine.executor.step import (
    Choose,
    Close,
    DecodeRow,
    Fork,
    Open,
    Outcome,
    Prefill,
    PrefillProgress,
    Reset,
    Rewind,
    SessionOp,
    Stats,
    Step,
    StepResult,
    Verified,
    _Chosen,
)
from engine.planner import prompt_groups
from engine.sampling import Sampler


class Stepped(Protocol):
    """The engine's operations a step runs (engine/executor/engine.py, rows.py, prefilling.py)."""

    prompt_sizes: tuple[int, ...]

    def begin_step(self, step: Step) -> None: ...

    def end_step(self) -> None: ...

    def open_sessions(self, request: Open) -> list[Session]: ...

    def share_prefix(self, session: Session, prompt: Sequence[int]) -> int: ...

    def start_prefill(
        self,
        session: Session,
        tokens: Sequence[int] | None = None,
        *,
        embeds: np.ndarray | None = None,
        ports: Mapping[str, np.ndarray] | None = None,
        logprob_top: int | None = None,
    ) -> PrefillTask: ...

    def prompt_width(self, task: PrefillTask, span: int = 0) -> int | None: ...

    def prefill_step(self, task: PrefillTask, span: int = 0) -> ForwardReport: ...

    def prefill_prompts(self, tasks: Sequence[PrefillTask], size: int) -> list[ForwardReport]: ...

    def rewind(self, session: Session, length: int) -> None: ...

    def reset_to(self, session: Session, tokens: Sequence[int]) -> None: ...

    def fork(self, source: Session, length: int | None = None) -> Session: ...

    def copy_session(self, source: Session, target: Session) -> None: ...

    def close_session(self, session: Session, keep: bool = True) -> None: ...

    def check_choose(self, session: Session) -> None: ...

    def choose_rows(
        self, sessions: Sequence[Session], samplers: Sequence[Sampler], picked: list[int] | None = None
    ) -> list[int]: ...

    def check_decode(self, row: DecodeRow) -> None: ...

    def decode_checked(self, rows: Sequence[DecodeRow]) -> list[int | None | Verified]: ...

    @property
    def last_batch(self) -> int: ...

    def stats(self) -> EngineStats: ...


def run_step(engine: Stepped, step: Step) -> StepResult:
    """Run one round's work on `engine`; every item's outcome comes back. The step's sessions are
    pinned to their rows while it runs: making room for one of them never parks another."""
    engine.begin_step(step)
    try:
        return _run(engine, step)
    finally:
        engine.end_step()


def _run(engine: Stepped, step: Step) -> StepResult:
    chosen = _Chosen()
    ops: list[Outcome] = []
    op_seconds: list[float] = []
    for i, op in enumerate(step.ops):
        started = time.perf_counter()
        ops.append(_op(engine, op, i, chosen))
        op_seconds.append(time.perf_counter() - started)
    opens = tuple(_outcome(engine.open_sessions, o) for o in step.opens)
    prefills, seconds = _prefills(engine, step.prefills, chosen)
    choices = _choose_first(engine, chosen, ops, prefills)
    started = time.perf_counter()
    decode = _decode_rows(engine, step.decode)
    batch = engine.last_batch if any(o.error is None for o in decode) else 0
    return StepResult(
        opens,
        tuple(ops),
        tuple(op_seconds),
        tuple(prefills),
        decode,
        batch,
        tuple(seconds),
        time.perf_counter() - started if batch else 0.0,
        choices,
    )


def _outcome(fn: Any, *args: Any) -> Outcome:
    try:
        return Outcome(fn(*args))
    except Exception as exc:  # noqa: BLE001 — each item fails alone; the scheduler reports faults
        return Outcome(error=exc)


def _op(engine: Stepped, op: SessionOp, index: int, chosen: _Chosen) -> Outcome:
    if isinstance(op, Choose):
        try:
            engine.check_choose(op.session)
        except Exception as exc:  # noqa: BLE001 — this choice fails alone
            return Outcome(error=exc)
        chosen.add(("op", index), [op.session], [op.sampler])
        return Outcome()  # the token is filled in by the step's batched choice
    if isinstance(op, Fork):
        return _outcome(engine.fork, op.source, op.length)
    if isinstance(op, Rewind):
        return _outcome(_rewind_to, engine, op.session, op.length)
    if isinstance(op, Reset):
        return _outcome(engine.reset_to, op.session, op.tokens)
    if isinstance(op, Close):
        return _outcome(_close, engine, op.session, op.keep)
    if isinstance(op, Stats):
        return _outcome(engine.stats)
    raise TypeError(f"not a session operation: {op!r}")


def _rewind_to(engine: Stepped, session: Session, length: int) -> int:
    engine.rewind(session, length)
    return session.length


def _close(engine: Stepped, session: Session, keep: bool) -> int:
    length = session.length
    engine.close_session(session, keep)
    return length


def _prefills(
    engine: Stepped, items: Sequence[tuple[Prefill, int]], chosen: _Chosen
) -> tuple[list[Outcome], list[float]]:
    """Each prefill item's forward: first every new prompt's shared prefix and plan, then the
    batchable first chunks of one width in one forward each group (engine.planner.prompt_groups),
    then the rest one by one. Seconds per item (a group's forward split among its prompts)."""
    outcomes: list[Outcome | None] = [None] * len(items)
    seconds = [0.0] * len(items)
    started: list[tuple[PrefillTask, int] | None] = []
    for i, (request, _) in enumerate(items):
        began = time.perf_counter()
        try:
            started.append(_start(engine, request))
        except Exception as exc:  # noqa: BLE001 — each item fails alone
            started.append(None)
            outcomes[i] = Outcome(error=exc)
        seconds[i] = time.perf_counter() - began
    widths = [
        engine.prompt_width(begun[0], span) if begun is not None and request.batchable else None
        for begun, (request, span) in zip(started, items, strict=True)
    ]
    for group in prompt_groups(widths, engine.prompt_sizes):
        began = time.perf_counter()
        tasks = [started[i][0] for i in group.items]  # type: ignore[index]
        try:
            reports: list[ForwardReport | None] = list(engine.prefill_prompts(tasks, group.size))
        except Exception as exc:  # noqa: BLE001 — the group's items fail, no other item
            for i in group.items:
                outcomes[i] = Outcome(error=exc)
            continue
        share = (time.perf_counter() - began) / len(group.items)
        for i, report in zip(group.items, reports, strict=True):
            task, shared = started[i]  # type: ignore[misc]
            outcomes[i] = _outcome(_finish, engine, items[i][0], task, report, shared, i, chosen)
            seconds[i] += share
    for i, (request, span) in enumerate(items):
        begun = started[i]
        if outcomes[i] is None and begun is not None:
            began = time.perf_counter()
            outcomes[i] = _outcome(_step_alone, engine, request, begun, span, i, chosen)
            seconds[i] += time.perf_counter() - began
    done = [o if o is not None else Outcome(error=RuntimeError("prefill item not run")) for o in outcomes]
    return done, [s if o.error is None else 0.0 for s, o in zip(seconds, done, strict=True)]


def _start(engine: Stepped, request: Prefill) -> tuple[PrefillTask, int]:
    """The request's task (planned now for a new prompt, after taking its shared prefix) and the
    prefix rows it shared."""
    if request.task is not None:
        return request.task, 0
    tokens: Sequence[int] = request.tokens
    shared = 0
    if request.share:
        shared = engine.share_prefix(request.session, tokens)
        tokens = tokens[shared:]
    return engine.start_prefill(request.session, tokens, logprob_top=request.logprob_top), shared


def _step_alone(
    engine: Stepped, request: Prefill, begun: tuple[PrefillTask, int], span: int, index: int, chosen: _Chosen
) -> PrefillProgress:
    task, shared = begun
    report = engine.prefill_step(task, span) if not task.done else None
    return _finish(engine, request, task, report, shared, index, chosen)


def _finish(
    engine: Stepped,
    request: Prefill,
    task: PrefillTask,
    report: ForwardReport | None,
    shared: int,
    index: int,
    chosen: _Chosen,
) -> PrefillProgress:
    """After the item's forward: a finished prompt is copied into its copies and its first tokens
    join the step's batched choice."""
    if not task.done:
        return PrefillProgress(task, report, shared)
    for copy in request.copies:
        engine.copy_session(request.session, copy)
    if request.samplers:
        sessions = [request.session, *request.copies]
        if len(request.samplers) < len(sessions):
            raise InvalidInput(f"{len(request.samplers)} samplers for {len(sessions)} sessions")
        # Samplers past the copies choose from the session's own logits: samples that start later,
        # on copies of it (service/worker/samples.py), with the first tokens they would have had now.
        sessions += [request.session] * (len(request.samplers) - len(sessions))
        chosen.add(("prefill", index), sessions, request.samplers)
    return PrefillProgress(task, report, shared)


def _choose_first(engine: Stepped, chosen: _Chosen, ops: list[Outcome], prefills: list[Outcome]) -> int:
    """Choose every first token of the step in one batched choice; the outcomes get them."""
    if not chosen.sessions:
        return 0
    try:
        tokens: list[int] | None = engine.choose_rows(chosen.sessions, chosen.samplers)
        error: BaseException | None = None
    except Exception as exc:  # noqa: BLE001 — every choice of the batch fails alike
        tokens, error = None, exc
    picked: dict[tuple[str, int], list[int]] = {}
    for i, owner in enumerate(chosen.owners):
        picked.setdefault(owner, []).append(tokens[i] if tokens is not None else -1)
    for (kind, index), mine in picked.items():
        if kind == "op":
            ops[index] = Outcome(mine[0], error)
        else:
            progress = prefills[index].value
            prefills[index] = Outcome(replace(progress, tokens=tuple(mine)) if error is None else None, error)
    return 1


def _decode_rows(engine: Stepped, rows: Sequence[DecodeRow]) -> tuple[Outcome, ...]:
    """One decode forward for the rows that pass `check_decode`; each other row fails alone."""
    checked: list[Outcome | None] = []
    for row in rows:
        try:
            engine.check_decode(row)
            checked.append(None)
        except Exception as exc:  # noqa: BLE001 — this row fails alone
            checked.append(Outcome(error=exc))
    good = [row for row, c in zip(rows, checked, strict=True) if c is None]
    if not good:
        return tuple(c for c in checked if c is not None)
    try:
        tokens = iter(engine.decode_checked(good))
        ran = [Outcome(next(tokens)) for _ in good]
    except Exception as exc:  # noqa: BLE001 — every row of a failed forward fails
        ran = [Outcome(error=exc) for _ in good]
    results = iter(ran)
    return tuple(c if c is not None else next(results) for c in checked)
