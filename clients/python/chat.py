"""Multi-turn chat on one server-side session: each turn sends only what the KV does not hold yet.

Owns the conversation and the token ids its session holds. A turn renders the whole
conversation with the server's chat template (Tokenize), keeps the longest prefix the
session already holds (Rewind past it if the re-rendered history differs from what
was generated), prefills the rest and decodes the reply. The template is never
written out here, so any model's chat format works.

Ctrl-C (KeyboardInterrupt) during a turn cancels its calls and raises ReplyStopped:
the part of the reply that arrived stays in the conversation, and the next turn
rewinds the session to what this side knows it holds, so the chat goes on. On the
main thread the turn takes SIGINT itself (`_CtrlC`): a KeyboardInterrupt raised
inside gRPC's own code can leave one of its locks held, and every later stream on
the channel then hangs.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import TypeVar

import grpc

from clients.python.messages import Sampling, Stopping, Turn, completion_of
from clients.python.sync_client import LadderClient
from proto.ladder.v1 import ladder_pb2 as pb

T = TypeVar("T")
BUSY_RETRIES = 50  # x 0.1 s: how long a call waits for a stopped reply to let go of the session


class ReplyStopped(Exception):
    """Ctrl-C stopped a reply; `text` is what arrived before it (kept in the conversation)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class ChatSession:
    """A conversation whose KV lives on the server between turns; `close()` returns it."""

    def __init__(
        self,
        client: LadderClient,
        *,
        system: str | None = None,
        max_new_tokens: int = 256,
        sampling: Sampling | None = None,
        stop: tuple[str, ...] = (),
        ignore_eos: bool = False,
    ) -> None:
        self.client = client
        self.turns: list[Turn] = [Turn("system", system)] if system else []
        self.max_new_tokens = max_new_tokens
        self.stopping = Stopping(max_new_tokens=max_new_tokens, stop=stop, ignore_eos=ignore_eos)
        self.sampling = sampling or Sampling()
        self.session_id = ""
        # A prefix of the token ids the server-side session holds; `exact` while it is all of them.
        self.held: list[int] = []
        self.exact = True
        self._capacity: int | None = None  # the server's KV capacity per session, asked once

    def _reply_budget(self) -> int:
        """max_new_tokens, cut to what the session's KV still has room for (a long chat gets shorter
        replies instead of OUT_OF_RANGE); at least 1, so a full session is the server's to refuse."""
        if self._capacity is None:
            self._capacity = self.client.model_info().capacity
        return max(1, min(self.max_new_tokens, self._capacity - len(self.held)))

    def ask(self, question: str, on_text: Callable[[str], None] | None = None) -> pb.Completion:
        """Add a user turn, stream the reply through `on_text`, and return its Completion."""
        self.turns.append(Turn("user", question))
        token_ids: list[int] = []
        pieces: list[str] = []

        def show(piece: str) -> None:
            pieces.append(piece)
            if on_text is not None:
                on_text(piece)

        ctrl_c = _CtrlC()
        try:
            with ctrl_c.taken():
                wanted = self.client.tokenize(self.turns)
                ctrl_c.check()
                self._sync_session(wanted, ctrl_c.watch)
                ctrl_c.check()
                events = self.client.decode(
                    self.session_id,
                    self._reply_budget(),
                    sampling=self.sampling,
                    stopping=self.stopping,
                    on_call=ctrl_c.watch,
                )
                completion = completion_of(echo_text(_token_ids_into(token_ids, events), show))
        except (KeyboardInterrupt, grpc.RpcError) as error:
            if isinstance(error, grpc.RpcError) and not ctrl_c.cancelled(error):
                raise
            self._stopped(token_ids, "".join(pieces))
            raise ReplyStopped("".join(pieces)) from None
        self.held = (self.held + list(completion.token_ids))[: completion.session_length]
        self.turns.append(Turn("assistant", completion.text))
        return completion

    def _stopped(self, token_ids: list[int], text: str) -> None:
        """Keep what arrived of a cancelled reply; the server may hold more than that now."""
        self.exact = False
        if not token_ids:
            self.turns.pop()  # nothing of the reply arrived: the question is not part of the chat
            return
        self.held += token_ids  # each streamed token was fed into the session before it was sent
        self.turns.append(Turn("assistant", text))

    def _sync_session(self, wanted: list[int], on_call: Callable[[grpc.Call], None] | None = None) -> None:
        """Make the session hold `wanted`: keep the shared prefix, prefill the rest."""
        keep = common_prefix_length(self.held, wanted)
        if keep == len(wanted):
            keep -= 1  # re-run the last token so the session has fresh next-token logits
        if self.session_id and (keep < len(self.held) or not self.exact):
            session_id = self.session_id
            _while_busy(lambda: self.client.rewind(session_id, keep))
            self.held, self.exact = self.held[:keep], True
        _, done = self.client.prefill(
            [wanted[keep:]], session_id=self.session_id, sampling=self.sampling, on_call=on_call
        )
        self.session_id = done.session_id
        self.held = wanted[: done.length]

    def close(self) -> None:
        if self.session_id:
            session_id = self.session_id
            _while_busy(lambda: self.client.close_session(session_id))
            self.session_id = ""
            self.held = []


class _CtrlC:
    """Ctrl-C during one turn, turned into cancelled calls instead of a KeyboardInterrupt inside gRPC.

    While `taken()`, SIGINT marks the turn stopped and cancels its streaming calls from another
    thread; the turn then sees a CANCELLED call, or the mark between two calls (`check`). Taken only
    on the main thread and only from Python's default handler (a program's own handler stays)."""

    def __init__(self) -> None:
        self.pressed = False
        self._calls: list[grpc.Call] = []
        self._lock = threading.Lock()

    @contextmanager
    def taken(self) -> Iterator[None]:
        if (
            threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
        ):
            yield
            return
        previous = signal.signal(signal.SIGINT, self._press)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def watch(self, call: grpc.Call) -> None:
        """A call of the turn, cancelled at Ctrl-C (at once if Ctrl-C came before it started)."""
        with self._lock:
            self._calls.append(call)
        if self.pressed:
            call.cancel()

    def check(self) -> None:
        """Between two calls: a Ctrl-C pressed meanwhile stops the turn here, in plain Python."""
        if self.pressed:
            raise KeyboardInterrupt

    def cancelled(self, error: grpc.RpcError) -> bool:
        """Whether `error` is a call of the turn that Ctrl-C cancelled."""
        return self.pressed and error.code() == grpc.StatusCode.CANCELLED

    def _press(self, signum: int, frame: FrameType | None) -> None:
        # A signal handler runs on the main thread between two bytecodes, maybe inside gRPC: it
        # takes no lock and cancels nothing itself.
        self.pressed = True
        threading.Thread(target=self._cancel_all, name="ladder-chat-ctrl-c", daemon=True).start()

    def _cancel_all(self) -> None:
        with self._lock:
            calls = list(self._calls)
        for call in calls:
            call.cancel()


def _while_busy(call: Callable[[], T]) -> T:
    """Make `call`, again while it fails ABORTED: a reply just cancelled may hold the session a moment."""
    for _ in range(BUSY_RETRIES):
        try:
            return call()
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.ABORTED:
                raise
        time.sleep(0.1)
    return call()


def _token_ids_into(token_ids: list[int], events: Iterable[pb.TokenEvent]) -> Iterator[pb.TokenEvent]:
    for event in events:
        if event.WhichOneof("event") == "token":
            token_ids.append(event.token.id)
        yield event


def echo_text(
    events: Iterable[pb.TokenEvent], on_text: Callable[[str], None] | None
) -> Iterator[pb.TokenEvent]:
    """Pass events through, handing each token's text (and any tail the Completion adds) to `on_text`."""
    shown = ""
    for event in events:
        if on_text is not None:
            piece = _new_text(event, shown)
            shown += piece
            if piece:
                on_text(piece)
        yield event


def _new_text(event: pb.TokenEvent, shown: str) -> str:
    if event.WhichOneof("event") == "token":
        return event.token.text
    # Text held back until the end (an unfinished character, a partial stop sequence) arrives only here.
    final = event.done.text
    return final[len(shown) :] if final.startswith(shown) else ""
