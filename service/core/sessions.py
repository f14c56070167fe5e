"""Server-side sessions: ids, owners, the logits they continue from, and idle expiry.

A session id is `<pod>.<token_urlsafe(16)>`: the pod that holds the KV, then
128 random bits, so ids route and cannot be guessed; a fork the client named is
`<pod>.f.<fork_id>` (a token has no dot, so the two never meet). An id a client
sends is checked before anything reads or echoes it: at most MAX_SESSION_ID
characters of [A-Za-z0-9._-], else NOT_FOUND with a message that does not
repeat it (so the owner trailer of WrongPod only ever carries a well-formed pod
name). Sessions are keyed by owner and id: to any caller but its opener a
session does not exist, and two callers' forks of one fork_id are two sessions.
The registry lives on the event loop; the engine session inside is only touched
on the worker.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from service.calls import ID_CHARACTERS, MAX_PLAIN_ID
from service.errors import ForkExists, SessionBusy, SessionNotFound, WrongPod

_TOKEN_BYTES = 16  # 128 random bits, as token_urlsafe characters of A-Z a-z 0-9 _ -
_FORK_MARK = ".f."  # between the pod and a fork_id


MAX_POD_NAME = MAX_PLAIN_ID - 1 - len(secrets.token_urlsafe(_TOKEN_BYTES))
# The longest id a session may have: a fork named by a 128-character fork_id on the longest pod.
MAX_SESSION_ID = MAX_POD_NAME + len(_FORK_MARK) + MAX_PLAIN_ID


@dataclass(frozen=True)
class ForkOrigin:
    """What a named fork was made from, so a retry of its ForkSession can be told from another fork."""

    source: str  # the source's session id
    asked: int | None  # the request's length (None: all)
    length: int  # tokens the fork held when made

    def matches(self, source: str, asked: int | None) -> bool:
        """Whether a ForkSession of `source` to `asked` tokens asks for this fork again."""
        return source == self.source and asked in (self.asked, self.length)


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
    fork_of: ForkOrigin | None = None  # a fork named by the client (ForkSessionRequest.fork_id)

    def generated_tokens(self) -> list[int]:
        """The tokens Decode chose that the session still holds (a Rewind drops the rest)."""
        session = self.session
        held = min(session.length, len(session.tokens))
        self.generated = [p for p in self.generated if p < held]
        return [session.tokens[p] for p in self.generated]


class SessionRegistry:
    def __init__(self, pod: str, per_caller: int, parking: bool = False) -> None:
        if not ID_CHARACTERS.fullmatch(pod) or "." in pod or len(pod) > MAX_POD_NAME:
            raise ValueError(
                f"pod name {pod!r} cannot prefix session ids: use 1 to {MAX_POD_NAME} "
                "characters of A-Z a-z 0-9 _ -"
            )
        self.pod = pod
        self.per_caller = per_caller
        self.parking = parking  # idle sessions may park off their KV slot (--session-memory-mb)
        self._sessions: dict[tuple[str, str], SessionState] = {}  # by (owner, id)
        self._forking: set[tuple[str, str]] = set()  # (owner, id) of named forks a call is making

    def __len__(self) -> int:
        return len(self._sessions)

    def new_id(self) -> str:
        return f"{self.pod}.{secrets.token_urlsafe(_TOKEN_BYTES)}"

    def fork_session_id(self, fork_id: str) -> str:
        """The session id of the fork the client names `fork_id` (a plain id, checked before)."""
        return f"{self.pod}{_FORK_MARK}{fork_id}"

    def add(self, state: SessionState) -> None:
        self._sessions[state.owner, state.id] = state
        self._idle(state, not state.busy)

    def _idle(self, state: SessionState, idle: bool) -> None:
        """Tell the engine whether the session may leave its slot for one who needs it (a bool the
        worker reads: at worst it parks a session a call is about to touch, which brings it back)."""
        if self.parking and state.session is not None:
            state.session.parkable = idle

    def get(self, session_id: str, caller: str) -> SessionState:
        if not session_id:
            raise SessionNotFound("no session id given")
        if len(session_id) > MAX_SESSION_ID or not ID_CHARACTERS.fullmatch(session_id):
            raise SessionNotFound(
                f"malformed session id ({len(session_id)} characters): ids are "
                f"<pod>.<token>, at most {MAX_SESSION_ID} characters of A-Z a-z 0-9 . _ -"
            )
        pod, dot, _ = session_id.partition(".")
        if not dot or not pod:
            raise SessionNotFound("malformed session id: ids are <pod>.<token>")
        if pod != self.pod:
            raise WrongPod(session_id, pod)
        state = self._sessions.get((caller, session_id))
        if state is None:
            raise SessionNotFound(f"no session {session_id}")  # well-formed: safe to repeat
        return state

    def remove(self, state: SessionState) -> None:
        if self._sessions.get((state.owner, state.id)) is state:  # not a later fork of the same fork_id
            del self._sessions[state.owner, state.id]

    def made_fork(self, session_id: str, caller: str, source: str, asked: int | None) -> SessionState | None:
        """The caller's named fork `session_id` when a ForkSession of `source` to `asked` tokens asks
        for it again (None: there is none); ForkExists when it is a fork of another source or length,
        SessionBusy while a call is making it (that call may yet close it: its answer not taken)."""
        if (caller, session_id) in self._forking:
            raise SessionBusy(f"fork {session_id} is being made by another call")
        state = self._sessions.get((caller, session_id))
        if state is None:
            return None
        if state.fork_of is None or not state.fork_of.matches(source, asked):
            raise ForkExists(f"fork {session_id} exists, forked from another session or to another length")
        return state

    def start_fork(self, session_id: str, caller: str) -> None:
        """Mark the caller's named fork as being made until `end_fork` (once its call has ended): a
        second call for it meanwhile is refused (made_fork), never answered with a fork the first
        call may yet close."""
        self._forking.add((caller, session_id))

    def end_fork(self, session_id: str, caller: str) -> None:
        self._forking.discard((caller, session_id))

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
