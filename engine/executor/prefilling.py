"""Prefill forwards, the engine's part that carries out the planner's prefill plans.

A prompt appended to a session is checked and planned (`start_prefill`), then
run one forward at a time (`prefill_step`): widened onto the ladder, run on the
session's row, checked (the logits-row self-check turns padding off for the
session for good when the head did not see the last real row), and rewound so
padded rows are never read. Restores live here too (rewind, `restore`,
`reset_to`): they re-run rows through the same forwards, as the planner's
restore rule says. `Prefiller` is the engine's part that does all this: it
holds what it is given (`Prefiller.__init__` says what) and the counts of what
it did, and reaches nothing of the engine else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import structlog

from engine.errors import InvalidInput, OverCapacity
from engine.executor.decode import BatchDecoder
from engine.executor.exactness import KernelRules
from engine.executor.prefill import (
    ForwardReport,
    PrefillTask,
    checked_feed,
    checked_ports,
    read_index,
    widen,
)
from engine.executor.prefix import HeldPrefixes
from engine.executor.session import Session
from engine.executor.shape import EngineShape
from engine.planner import (
    CapacityExceeded,
    Forward,
    PaddingPolicy,
    PortShape,
    PrefillPlan,
    fresh_after,
    plan_prefill,
    recompute_from,
)
from engine.planner.drafts import verify_width
from engine.runtime.backend import Backend, HeadRows
from engine.runtime.pool import KvPool
from engine.runtime.variants import Variant, VariantKey

log = structlog.get_logger("ladder.engine")


def check_length(session: Session, length: int) -> None:
    """A length a rewind or fork keeps must be one the session holds."""
    if not 0 <= length <= session.length:
        raise InvalidInput(
            f"cannot keep {length} tokens: the session holds {session.length}",
            reason="LENGTH_PAST_END",
            field="length",
        )


class Prefiller:
    """The prefill runner: it runs a session's prompt forwards, re-runs rows (restore, rewind,
    `reset_to`) and the verification forward, and counts what it did. It is given the engine's
    geometry, the backend, the pool, the decoder (a one-row forward is a decode step), the held
    prefixes (a rewind cuts their index), `variant` (the prepared forward of a shape, or None to run
    it eagerly), how many new prompts one forward takes (`prompt_sizes`), the kernel rules (which
    `Engine.follow` replaces after load) and `check_open` (the session table's: a closed session
    fails, a parked one comes back onto a row)."""

    def __init__(
        self,
        shape: EngineShape,
        backend: Backend[Any],
        pool: KvPool,
        decoder: BatchDecoder,
        prefixes: HeldPrefixes,
        variant: Callable[[VariantKey], Variant | None],
        prompt_sizes: tuple[int, ...],
        kernels: KernelRules,
        check_open: Callable[[Session], None],
    ) -> None:
        self.shape = shape
        self.backend = backend
        self.pool = pool
        self.decoder = decoder
        self.prefixes = prefixes
        self.variant = variant
        self.prompt_sizes = prompt_sizes  # how many new prompts one prefill forward takes (none: each alone)
        self.kernels = kernels  # the exactness rules this machine's kernels allow (kernels.py)
        self.check_open = check_open
        self.sessions_padding_off = 0  # sessions whose padding the self-check turned off
        self.prompt_forwards = 0  # forwards that ran several new prompts (`prefill_prompts`)
        self.prompts_batched = 0  # ... and the prompts they ran

    # -- prefill ------------------------------------------------------------------------
    def plan(
        self, session: Session, rows: int, ports: tuple[PortShape, ...] = (), span: int = 0
    ) -> PrefillPlan:
        policy = PaddingPolicy(
            enabled=self.shape.options.padding,
            recurrent_state=self.shape.info.recurrent_state,
            session_padding_on=session.padding_on,
        )
        chunk, limits = self.shape.chunk_size, self.shape.limits
        try:
            return plan_prefill(session.length, rows, chunk, limits, policy, ports, span)
        except CapacityExceeded as exc:
            raise OverCapacity(str(exc)) from exc

    def start_prefill(
        self,
        session: Session,
        tokens: Sequence[int] | None = None,
        *,
        embeds: np.ndarray | None = None,
        ports: Mapping[str, np.ndarray] | None = None,
        logprob_top: int | None = None,
    ) -> PrefillTask:
        """Check and plan a prompt appended to `session`; nothing runs yet. With `logprob_top` each
        forward also computes the log-probabilities of the prompt's tokens after the first (and
        that many alternatives) from its real logits rows: `task.logprobs`."""
        self.check_open(session)
        feed, ids = checked_feed(self.shape.info, self.shape.feed_dtype, tokens, embeds)
        supplied = checked_ports(self.shape.port_dtypes, ports or {})
        again = self._again(session, len(ids)) if ids is not None and not supplied else 0
        if again and ids is not None:
            ids = session.tokens[session.length - again :] + ids
            self._truncate(session, session.length - again)
            feed = np.asarray([ids], np.int64)
        plan = self.plan(session, feed.shape[1], tuple(PortShape(n, a.shape) for n, a in supplied.items()))
        per_token = set(plan.padding.per_token_ports)
        streamed = {n: a for n, a in supplied.items() if n in per_token}
        constants = {n: a for n, a in supplied.items() if n not in per_token}
        if logprob_top is not None and ids is None:
            raise InvalidInput("prompt log-probabilities need token ids, not embeddings")
        return PrefillTask(
            session, feed, ids, streamed, constants, list(plan.forwards), logprob_top, again=again
        )

    def _again(self, session: Session, rows: int) -> int:
        """How many rows the session holds that an append of `rows` computes again, so that its
        rows come out as a fresh run's (engine.planner.restore); 0 when they cannot be re-run."""
        if len(session.tokens) != session.length or self.shape.unbatched_reason:
            return 0
        target, chunk = session.length + rows, self.shape.chunk_size
        start = recompute_from(session.length, session.fresh, target, chunk, self.fresh_forwards)
        return session.length - start

    def restore(self, session: Session) -> None:
        """Compute the session's next-token logits again, and rows a decode step wrote before them,
        as a fresh run of its tokens would (rewind, a shorter fork)."""
        if len(session.tokens) != session.length or self.shape.unbatched_reason or not session.length:
            return self._restore_exact(session)
        length = session.length
        start = recompute_from(length, session.fresh, length, self.shape.chunk_size, self.fresh_forwards)
        ids = session.tokens[start:]
        self._truncate(session, start)
        self._run(self.start_prefill(session, ids))
        return None

    def _run(self, task: PrefillTask) -> None:
        while not task.done:
            self.prefill_step(task)

    def _restore_exact(self, session: Session) -> None:
        """Run the last held token again alone (a decoder whose rows cannot be re-run in a block)."""
        last = session.tokens[-1]
        self._truncate(session, session.length - 1)
        self.prefill_step(self.start_prefill(session, [last]))

    def _truncate(self, session: Session, length: int) -> None:
        self.pool.commit(session, length)
        session.fresh = min(session.fresh, length)
        del session.tokens[length:]
        self.prefixes.index.truncate(session.row, length)

    @property
    def fresh_forwards(self) -> bool:
        """Whether re-runs and shared prefixes keep to a fresh run's own forwards (same past, rows
        and width): the deterministic mode, and every mode on a backend whose rows follow the width."""
        return self.shape.options.deterministic or self.kernels.fresh_forwards

    @property
    def shared_span(self) -> int:
        """Rows a prefill forward takes while sessions decode: the middle ladder rung (0 = a chunk;
        always a chunk in the deterministic mode, whose prefill forwards are a fresh run's own)."""
        if self.shape.options.deterministic or not self.shape.ladder:
            return 0
        return self.shape.ladder[len(self.shape.ladder) // 2]

    def prefill_step(self, task: PrefillTask, span: int = 0) -> ForwardReport:
        """Run the task's next forward, of at most `span` real rows when given; the session's
        next-token logits follow it."""
        self.decoder.settle()
        if span and task.forwards[0].rows > span:
            task.forwards = self._replan(task, span)
        forward = task.forwards.pop(0)
        self.check_open(task.session)
        return self._after_forward(
            task, forward, forward.width, self._prefill_forward(task, forward, forward.width)
        )

    def prompt_width(self, task: PrefillTask, span: int = 0) -> int | None:
        """The width of the task's next forward when it may share a forward with other new prompts
        (`prefill_prompts`): a first chunk of token ids on the ladder, no past, no ports, no prompt
        log-probabilities. None otherwise (it runs alone, `prefill_step`)."""
        if not self.prompt_sizes or task.done:
            return None
        if span and task.forwards[0].rows > span:
            task.forwards = self._replan(task, span)
        forward, session = task.forwards[0], task.session
        alone = (
            forward.past
            or session.length
            or task.streamed
            or task.constants
            or task.ids is None
            or task.logprob_top is not None
            or session.closed
            or not session.padding_on
            or forward.width not in self.shape.padded_ladder
            or forward.width < 2
        )
        return None if alone else forward.width

    def prefill_prompts(self, tasks: Sequence[PrefillTask], size: int) -> list[ForwardReport]:
        """Run the next forward of each task, new prompts' first chunks of one width (`prompt_width`),
        as one forward of `size` prompts (rows past the tasks run empty). Their rows are not those a
        fresh run computes (the forward is wider), so they are never shared as a held prefix, and
        a later append re-runs them: the service asks this only for a Generate's own sessions."""
        self.decoder.settle()
        forwards = [task.forwards[0] for task in tasks]
        width = forwards[0].width
        if len(tasks) > size or any(f.width != width or f.past for f in forwards):
            raise ValueError(f"not {size} first chunks of one width: {forwards}")
        for task in tasks:
            self.check_open(task.session)
        key = VariantKey(width, prompts=size, reads=size)
        read = np.asarray([f.rows - 1 for f in forwards] + [0] * (size - len(tasks)), np.int64)
        feed = np.concatenate([task.chunk(f, width)[0] for task, f in zip(tasks, forwards, strict=True)])
        rows = [task.session.row for task in tasks]
        for row in rows:
            self.pool.set_mask(row, width)
        try:
            out = self.backend.run_prompts(self.variant(key), key, rows, feed, read)
        except BaseException:
            for task in tasks:
                self.pool.set_mask(task.session.row, task.session.length)
            raise
        self.prompt_forwards += 1
        self.prompts_batched += len(tasks)
        reports = []
        for i, (task, forward) in enumerate(zip(tasks, forwards, strict=True)):
            task.forwards.pop(0)
            self.pool.commit(task.session, forward.rows)  # rewind: padded rows are past the length
            reports.append(
                self._after_forward(task, forward, width, HeadRows(out.logits[i : i + 1], out.seen))
            )
        return reports

    def warm_prompts(self, width: int, size: int) -> None:
        """Run the shape of `size` prompts at `width` once on empty rows (prepared, captured on CUDA)."""
        key = VariantKey(width, prompts=size, reads=size)
        self.backend.run_prompts(
            self.variant(key), key, [], np.zeros((0, width), self.shape.feed_dtype), np.zeros(size, np.int64)
        )

    def _after_forward(
        self, task: PrefillTask, forward: Forward, width: int, out: HeadRows | None
    ) -> ForwardReport:
        """The self-check (a forward whose head missed the last real row runs again unpadded),
        prompt log-probabilities, the kept logits row and the session's tokens and counters."""
        session = task.session
        if width > forward.rows and out is not None and not out.saw_real_row(forward.rows, width):
            self._trip_self_check(session, forward, width, out)
            width, out = forward.rows, self._prefill_forward(task, forward, forward.rows)
            task.forwards = self._replan(task)
        if task.logprob_top is not None:
            self._prompt_logprobs(task, forward, None if out is None else out.logits)
        if out is not None:
            # Keep the last real row; a decoder that emits fewer rows gives its last one.
            self.backend.keep_row(session.row, out.logits, out.last_real(forward.rows))
        session.has_logits = True
        if task.ids is not None and out is not None:  # a decode step has appended its token itself
            session.tokens.extend(task.ids[forward.start : forward.start + forward.rows])
        stats = session.stats
        stats.forwards += 1
        stats.real_rows += forward.rows
        stats.padded_rows += width - forward.rows
        return ForwardReport(forward, width, session.length)

    def _prompt_logprobs(self, task: PrefillTask, forward: Forward, logits: Any) -> None:
        """Row i of the forward predicts prompt token start + i + 1: score the real rows whose next token
        is in the prompt (never a padded row: they all come after the real ones)."""
        assert task.ids is not None and task.logprob_top is not None
        targets = task.ids[forward.start + 1 : forward.start + forward.rows + 1]
        skip = max(0, task.again - forward.start)  # rows computed again predict tokens held already
        if len(targets) <= skip:
            return
        if logits is None:  # a single row ran as a decode step: its logits are in the store
            found = self.backend.logprobs([task.session.row], targets, task.logprob_top)
        elif logits.shape[1] < len(targets):
            raise InvalidInput(
                "this decoder returns fewer logits rows than it is fed: it has no prompt log-probabilities"
            )
        else:
            found = self.backend.prompt_logprobs(logits, targets, task.logprob_top)
        task.logprobs.extend(found[skip:])

    def _prefill_forward(self, task: PrefillTask, forward: Forward, width: int) -> HeadRows | None:
        session, rows = task.session, forward.rows
        if width == 1 and not task.streamed and not task.constants and not self.shape.unbatched_reason:
            # A single row is a decode step of this session alone: no shape of its own.
            assert task.ids is not None
            self.decoder.forward({session.row: task.ids[forward.start]})
            return None
        feed, ports = task.chunk(forward, width)
        # Prompt log-probabilities need every real row's logits: a head that reads chosen rows reads them all.
        reads = width if task.logprob_top is not None and self.shape.info.logits_rows else 1
        key = VariantKey(width, tuple(sorted(ports)), reads=reads)
        self.pool.set_mask(session.row, forward.past + width)
        try:
            out = self.backend.run_rows(
                self.variant(key),
                key,
                session.row,
                forward.past,
                feed,
                ports,
                task.constants,
                read_index(rows, key.reads),
            )
        except BaseException:
            self.pool.set_mask(session.row, session.length)
            raise
        # Rewind: the padded rows' KV is erased from the logical length.
        self.pool.commit(session, forward.past + rows)
        session.fresh = fresh_after(
            session.fresh, forward.past, rows, width, self.shape.chunk_size, self.fresh_forwards
        )
        return out

    def _trip_self_check(self, session: Session, forward: Forward, width: int, out: HeadRows) -> None:
        session.padding_on = False
        session.stats.self_check_reruns += 1
        self.sessions_padding_off += 1
        log.warning(
            "padding_off_for_session",
            row=session.row,
            width=width,
            logits_rows=out.logits.shape[1],
            seen=None if out.seen is None else out.seen.tolist(),
            past=forward.past,
            reason="the head did not see the last real row among as many rows as the forward ran",
        )
        self.pool.commit(session, forward.past)
        session.fresh = min(session.fresh, forward.past)

    def _replan(self, task: PrefillTask, span: int = 0) -> list[Forward]:
        """The forwards still to run, planned again (padding now off, or smaller steps)."""
        if not task.forwards:
            return []
        start = task.forwards[0].start
        rows = task.rows - start
        ports = (
            *(PortShape(n, (1, rows, *a.shape[2:])) for n, a in task.streamed.items()),
            *(PortShape(n, a.shape) for n, a in task.constants.items()),
        )
        plan = self.plan(task.session, rows, ports, span)
        return [replace(f, start=f.start + start) for f in plan.forwards]

    # -- speculation (issue #44) -------------------------------------------------------------
    def verify_forward(self, session: Session, ids: Sequence[int]) -> HeadRows | None:
        """Run `ids` (a decode row's token and its draft) on top of the session in one forward of
        every row's logits, on the verification ladder (engine.planner.drafts.verify_width). The
        session is left as it was: the caller commits the rows it keeps. None when the head did
        not read every real row back in order (a decoder that returns fewer rows): then no forward
        of this kind can verify a draft, and the engine stops drafting for good."""
        self.decoder.settle()
        self.check_open(session)
        rows, past = len(ids), session.length
        width = verify_width(rows)
        feed = widen(np.asarray([ids], np.int64), rows, width)
        key = VariantKey(width, (), reads=width)
        self.pool.set_mask(session.row, past + width)
        try:
            out = self.backend.run_rows(
                self.variant(key), key, session.row, past, feed, {}, {}, read_index(rows, width)
            )
        finally:
            self.pool.set_mask(session.row, past)  # the rows it keeps are committed by the caller
        read = out.seen[:rows].tolist() if out.seen is not None else list(range(int(out.logits.shape[1])))
        return out if read[:rows] == list(range(rows)) else None

    # -- rewind ---------------------------------------------------------------------------
    def rewind(self, session: Session, length: int) -> None:
        """Keep the first `length` tokens; the next-token logits are those of the tokens kept."""
        self.check_open(session)
        check_length(session, length)
        if length == session.length:
            return
        self.decoder.settle()
        if self.shape.info.recurrent_state and length != 0:
            raise InvalidInput("a decoder with recurrent state can only rewind to 0")
        if length == 0 or not session.tokens or self.shape.info.supplied_ports:
            # Without the token ids and ports of the last kept row nothing can be run again: no logits.
            self._truncate(session, length)
            session.has_logits = False
            if length == 0:
                self.backend.clear_state(session.row)
            return
        self._truncate(session, length)
        self.restore(session)

    def reset_to(self, session: Session, tokens: Sequence[int]) -> None:
        """Make the session hold exactly `tokens`, with their next-token logits (an extension that
        did not finish is undone: rows it cut to compute again are computed again)."""
        self.check_open(session)
        tokens = list(tokens)
        if session.tokens == tokens and session.has_logits:
            return
        self.decoder.settle()
        common = 0
        for held, wanted in zip(session.tokens, tokens, strict=False):
            if held != wanted:
                break
            common += 1
        if common == len(tokens):
            self.rewind(session, common)
            return
        self._truncate(session, common)
        self._run(self.start_prefill(session, tokens[common:]))
