"""Server-side sessions: ids, owners, the logits they continue from, and idle expiry.

A session id is `<pod>.<token_urlsafe(16)>`: the pod that holds the KV, then
128 random bits, so ids route and cannot be guessed. When auth is on a session
belongs to its opener; to anyone else it does not exist. The registry lives on
the event loop; the engine session inside is only touched on the worker.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from service.errors import QueueFull, SessionBusy, SessionNotFound, WrongPod


@dataclass(eq=False)
class SessionState:
    id: str
    owner: str
    session: Any  # engine.executor.Session, touched only on the worker
    last_used: float = field(default_factory=time.monotonic)
    busy: bool = False


class SessionRegistry:
    def __init__(self, pod: str, per_caller: int) -> None:
        self.pod = pod
        self.per_caller = per_caller
        self._sessions: dict[str, SessionState] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def new_id(self) -> str:
        return f"{self.pod}.{secrets.token_urlsafe(16)}"

    def check_quota(self, caller: str) -> None:
        """Refuse a caller who already holds sessions_per_caller sessions."""
        held = sum(1 for s in self._sessions.values() if s.owner == caller)
        if self.per_caller and held >= self.per_caller:
            raise QueueFull(f"this caller already holds {held} sessions (the limit is {self.per_caller})")

    def add(self, state: SessionState) -> None:
        self._sessions[state.id] = state

    def get(self, session_id: str, caller: str) -> SessionState:
        pod, dot, _ = session_id.partition(".")
        if not dot or not pod:
            raise SessionNotFound(f"malformed session id {session_id!r}")
        if pod != self.pod:
            raise WrongPod(session_id, pod)
        state = self._sessions.get(session_id)
        if state is None or state.owner != caller:
            raise SessionNotFound(f"no session {session_id}")
        return state

    def remove(self, state: SessionState) -> None:
        self._sessions.pop(state.id, None)

    @contextmanager
    def using(self, state: SessionState) -> Iterator[SessionState]:
        """Hold the session for one call; a second concurrent call is refused."""
        if state.busy:
            raise SessionBusy(f"session {state.id} is in use by another call")
        state.busy = True
        try:
            yield state
        finally:
            state.busy = False
            state.last_used = time.monotonic()

    def idle(self, seconds: float) -> list[SessionState]:
        """Sessions nobody has used for `seconds` (and nobody is using now)."""
        cutoff = time.monotonic() - seconds
        return [s for s in self._sessions.values() if not s.busy and s.last_used < cutoff]

    def all(self) -> list[SessionState]:
        return list(self._sessions.values())
