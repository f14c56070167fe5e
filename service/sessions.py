"""Server-side sessions: ids, owners, the logits they continue from, and idle expiry.

A session id is `<pod>.<token_urlsafe(16)>`: the pod that holds the KV, then
128 random bits, so ids route and cannot be guessed. An id a client sends is
checked before anything reads or echoes it: at most 128 characters of
[A-Za-z0-9._-], else NOT_FOUND with a message that does not repeat it (so the
owner trailer of WrongPod only ever carries a well-formed pod name). When auth
is on a session belongs to its opener; to anyone else it does not exist. The
registry lives on the event loop; the engine session inside is only touched on
the worker.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from service.errors import SessionBusy, SessionNotFound, WrongPod

MAX_SESSION_ID = 128
_SESSION_ID = re.compile(r"[A-Za-z0-9._-]+")
_TOKEN_BYTES = 16  # 128 random bits, as token_urlsafe characters of A-Z a-z 0-9 _ -


def plain_id(text: str) -> bool:
    """Whether `text` may name a session or a request: at most 128 characters of A-Z a-z 0-9 . _ -."""
    return len(text) <= MAX_SESSION_ID and _SESSION_ID.fullmatch(text) is not None


MAX_POD_NAME = MAX_SESSION_ID - 1 - len(secrets.token_urlsafe(_TOKEN_BYTES))


@dataclass(eq=False)
class SessionState:
    id: str
    owner: str
    session: Any  # engine.executor.Session, touched only on the worker
    last_used: float = field(default_factory=time.monotonic)
    busy: bool = False
    # Positions whose tokens a Decode chose (worker-side, like `session`): presence and frequency
    # penalties count them in every later Decode, so Decode(n) + Decode(m) = Decode(n + m).
    generated: list[int] = field(default_factory=list)

    def generated_tokens(self) -> list[int]:
        """The tokens Decode chose that the session still holds (a Rewind drops the rest)."""
        session = self.session
        held = min(session.length, len(session.tokens))
        self.generated = [p for p in self.generated if p < held]
        return [session.tokens[p] for p in self.generated]


class SessionRegistry:
    def __init__(self, pod: str, per_caller: int, parking: bool = False) -> None:
        if not _SESSION_ID.fullmatch(pod) or "." in pod or len(pod) > MAX_POD_NAME:
            raise ValueError(f"pod name {pod!r} cannot prefix session ids: use 1 to {MAX_POD_NAME} "
                             "characters of A-Z a-z 0-9 _ -")
        self.pod = pod
        self.per_caller = per_caller
        self.parking = parking  # idle sessions may park off their KV slot (--session-memory-mb)
        self._sessions: dict[str, SessionState] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def new_id(self) -> str:
        return f"{self.pod}.{secrets.token_urlsafe(_TOKEN_BYTES)}"

    def add(self, state: SessionState) -> None:
        self._sessions[state.id] = state
        self._idle(state, not state.busy)

    def _idle(self, state: SessionState, idle: bool) -> None:
        """Tell the engine whether the session may leave its slot for one who needs it (a bool the
        worker reads: at worst it parks a session a call is about to touch, which brings it back)."""
        if self.parking and state.session is not None:
            state.session.parkable = idle

    def get(self, session_id: str, caller: str) -> SessionState:
        if not session_id:
            raise SessionNotFound("no session id given")
        if len(session_id) > MAX_SESSION_ID or not _SESSION_ID.fullmatch(session_id):
            raise SessionNotFound(f"malformed session id ({len(session_id)} characters): ids are "
                                  f"<pod>.<token>, at most {MAX_SESSION_ID} characters of A-Z a-z 0-9 . _ -")
        pod, dot, _ = session_id.partition(".")
        if not dot or not pod:
            raise SessionNotFound("malformed session id: ids are <pod>.<token>")
        if pod != self.pod:
            raise WrongPod(session_id, pod)
        state = self._sessions.get(session_id)
        if state is None or state.owner != caller:
            raise SessionNotFound(f"no session {session_id}")  # well-formed: safe to repeat
        return state

    def remove(self, state: SessionState) -> None:
        self._sessions.pop(state.id, None)

    @contextmanager
    def using(self, state: SessionState) -> Iterator[SessionState]:
        """Hold the session for one call; a second concurrent call is refused."""
        if state.busy:
            raise SessionBusy(f"session {state.id} is in use by another call")
        state.busy = True
        self._idle(state, False)
        try:
            yield state
        finally:
            state.busy = False
            self._idle(state, True)
            state.last_used = time.monotonic()

    def idle(self, seconds: float) -> list[SessionState]:
        """Sessions nobody has used for `seconds` (and nobody is using now)."""
        cutoff = time.monotonic() - seconds
        return [s for s in self._sessions.values() if not s.busy and s.last_used < cutoff]

    def all(self) -> list[SessionState]:
        return list(self._sessions.values())
