"""What every call of a serving server shares (Serving): the config, the model, the worker's scheduler,
the sessions and what each caller holds, with the rules that span calls: a caller's share of the
KV slots and of the session memory, whose held prefixes a prompt may start from, opening and
closing sessions on the worker, and undoing a Prefill that did not finish (Extension).
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from engine.errors import Exhausted, InvalidInput, ParkingFull
from engine.executor.facts import EngineFacts
from engine.executor.step import Reset, Rewind
from service.config import Config
from service.core.constraints import Constraints
from service.core.counting import Totals
from service.core.sessions import SessionRegistry, SessionState
from service.errors import CallerQuota, Draining, OverLimit
from service.metrics import Metrics
from service.served_model import ServedModel
from service.worker.generation import close_body
from service.worker.jobs import Body
from service.worker.rounds import ask
from service.worker.scheduler import Scheduler

log = structlog.get_logger("ladder.sessions")
MAX_SAMPLES = 128  # samples one request may ask for (OpenAI's limit on n)


def sample_limits(facts: EngineFacts, n: int) -> None:
    """Refuse n samples the server can never run: over MAX_SAMPLES, a decoder with recurrent
    state (n > 1 copies KV rows), fewer than two KV slots (the prompt's holder and a sample)."""
    if n > MAX_SAMPLES:
        raise OverLimit(f"n = {n} samples; the limit is {MAX_SAMPLES}", reason="TOO_MANY_SAMPLES", field="n")
    if n == 1:
        return
    if facts.recurrent:
        raise InvalidInput(
            "n > 1 copies the prompt's KV rows, and this decoder carries recurrent state that has none",
            reason="SAMPLES_UNSUPPORTED",
            field="n",
        )
    if facts.slots < 2:
        raise OverLimit(
            f"n = {n} samples need 2 KV slots at once (the prompt's and a sample's); "
            f"the server has {facts.slots}",
            reason="TOO_MANY_SAMPLES",
            field="n",
        )


def caller_share(configured: int, slots: int) -> int:
    """Sessions one caller may hold: `sessions_per_caller` when set, else every KV slot but one."""
    return configured or max(1, slots - 1)


def caller_memory_share(config: Config, budget: int) -> int:
    """Bytes one caller's open sessions may hold of the session memory `budget` (0: no limit):
    --session-memory-per-caller-mb when set, else half the budget when auth tells callers apart
    (one caller leaves the other half to the rest), else none (every client is the one caller)."""
    if not budget:
        return 0
    if config.session_memory_per_caller_mb is not None:
        return config.session_memory_per_caller_mb << 20
    return budget // 2 if config.auth_tokens or config.tls_client_ca else 0


@dataclass(eq=False)
class Extension:
    """What one Prefill does to its session: opens it, or extends it from `length` tokens.

    `length` is read on the worker when the Prefill's first part starts there (None until then:
    nothing has run), and the restore reads it on the worker after the Prefill's last job."""

    state: SessionState
    opened: bool
    length: int | None = None
    tokens: list[int] = field(default_factory=list)

    def marked(self, body: Body) -> Body:
        """`body`, noting first the tokens it finds the session holding (on the worker)."""
        if self.length is None:
            self.length = self.state.session.length
            self.tokens = list(self.state.session.tokens)
        yield from body

    def restore(self) -> Body:
        """A job that brings the session back to the tokens the Prefill found it holding (the logits
        follow); an extension may have cut rows it computes again (engine.planner.restore)."""
        session = self.state.session
        if self.length is None or session.closed or session.tokens == self.tokens:
            return
        if len(self.tokens) == self.length:
            yield from ask(Reset(session, tuple(self.tokens)))
        elif session.length > self.length:
            yield from ask(Rewind(session, self.length))


@dataclass
class Serving:
    """What every call of a serving server shares: the config, the model, the worker's scheduler,
    the sessions, the metrics, and what each caller holds. It exists once the model has loaded."""

    config: Config
    model: ServedModel
    scheduler: Scheduler
    sessions: SessionRegistry
    metrics: Metrics
    constraints: Constraints
    totals: Totals = field(default_factory=Totals)
    opening: Counter[str] = field(default_factory=Counter)  # sessions each caller waits for

    def held(self, caller: str) -> tuple[int, int]:
        """The sessions `caller` holds or waits for, and how many it may hold: its share of the KV
        slots, or, when idle sessions park (--session-memory-mb), `sessions_per_caller` if set."""
        if self.sessions.parking:
            share = self.config.sessions_per_caller or sys.maxsize
        else:
            share = caller_share(self.config.sessions_per_caller, self.model.facts.slots)
        return sum(1 for s in self.sessions.all() if s.owner == caller) + self.opening[caller], share

    def check_share(self, caller: str) -> None:
        """Refuse a caller who holds (or waits for) its share of the sessions, or whose open sessions
        hold its share of the session memory. The memory itself the engine keeps: a new session
        that would park another past it fails there (ParkingFull), one that takes a free slot opens."""
        held, share = self.held(caller)
        if held >= share:
            raise CallerQuota(
                f"this caller already holds {held} sessions (the limit is {share}; see --sessions-per-caller)"
            )
        memory_share = caller_memory_share(self.config, self.model.session_memory)
        holds = self.held_memory(caller) if memory_share else 0
        if memory_share and holds >= memory_share:
            raise CallerQuota(
                f"this caller's sessions hold {holds >> 10} KiB, its share of the session "
                f"memory is {memory_share >> 10} KiB (see --session-memory-per-caller-mb)"
            )

    def held_memory(self, caller: str) -> int:
        """What the caller's open sessions hold or would hold parked (a length read off the worker:
        an int, at worst a call behind)."""
        size = self.model.engine.parked_size
        return sum(
            size(s.session.length) for s in self.sessions.all() if s.owner == caller and s.session is not None
        )

    def scope(self, caller: str) -> str:
        """Whose held prefixes a caller's prompts may start from: its own, unless the operator
        lets callers that auth tells apart share them (a shared prefix's speed is visible to others)."""
        return "" if self.config.prefix_across_callers else caller

    def sample_width(self, n: int, caller: str) -> int:
        """The KV slots n samples of `caller` may hold at once: n when the server and the caller's
        share have them, else fewer (the samples then start as slots free: service/worker/samples.py), but
        never fewer than two (the prompt's holder and a sample); `sample_limits` first."""
        sample_limits(self.model.facts, n)
        if n == 1:
            return 1
        width = min(n, self.model.facts.slots)
        if self.sessions.parking:  # parked sessions hold no slot the samples need
            return width
        held, share = self.held(caller)
        if share - held < 2:
            raise CallerQuota(
                f"n = {n} samples need 2 KV slots at once; beside the {held} sessions this "
                f"caller holds, its share of {share} KV slots leaves {max(share - held, 0)} "
                "(see --sessions-per-caller)"
            )
        return min(width, share - held)

    async def open_session(self, caller: str) -> SessionState:
        return await self.claim(lambda caller: self.scheduler.open_session(self.scope(caller)), caller)

    async def claim(
        self, opening: Callable[[str], Awaitable[Any]], caller: str, session_id: str = ""
    ) -> SessionState:
        """A new session for `caller`, within its share, from `opening(caller)` (an engine Session),
        with the id `session_id` (a named fork's), or a random one."""
        self.check_share(caller)
        self.opening[caller] += 1
        try:
            # Waits in the bounded queue while every KV slot is taken.
            task = asyncio.ensure_future(opening(caller))
            try:
                session = await asyncio.shield(task)
            except asyncio.CancelledError:  # the caller left while the slot was being taken: give it back
                task.add_done_callback(self._close_orphan)
                raise
            except ParkingFull as full:
                raise Exhausted(
                    f"{full}: the memory --session-memory-mb gives parked sessions is full; "
                    "close sessions or wait for idle ones to expire"
                ) from full
        finally:
            self.opening[caller] -= 1
        state = SessionState(session_id or self.sessions.new_id(), caller, session)
        self.sessions.add(state)
        log.info("session_opened", session=state.id, caller=caller, sessions_open=len(self.sessions))
        return state

    async def extension(self, session_id: str, caller: str) -> Extension:
        """What a Prefill works on: a new session (no id) or the caller's own."""
        if not session_id:
            return Extension(await self.open_session(caller), opened=True)
        return Extension(self.sessions.get(session_id, caller), opened=False)

    def _close_orphan(self, opening: asyncio.Future[Any]) -> None:
        if not opening.cancelled() and opening.exception() is None:
            self.close_soon(SessionState("", "", opening.result()))

    def close_soon(self, state: SessionState, reason: str = "") -> None:
        """Forget the session and return its KV slot on the worker (safe inside a cancelled call)."""
        self.sessions.remove(state)
        self._soon(close_body(state, reason))

    def undo(self, extension: Extension) -> None:
        """Put the session back as an unfinished Prefill found it: closed if it opened it, else
        rewound on the worker, after the Prefill's own jobs have ended. A decoder with recurrent
        state rewinds only to 0: its session is closed instead."""
        if extension.opened or self.model.facts.recurrent:
            self.close_soon(extension.state, "prefill_unfinished")
        else:
            self._soon(extension.restore())

    def _soon(self, body: Body) -> None:
        """Run the job `body` on the worker after every job submitted before it, without waiting."""
        try:
            self.scheduler.submit(body, bounded=False)
        except Draining:  # the server is stopping: its sessions go with it
            body.close()
