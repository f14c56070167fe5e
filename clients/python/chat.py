"""Multi-turn chat on one server-side session: each turn sends only what the KV does not hold yet.

Owns the conversation and the token ids its session holds. A turn renders the whole
conversation with the server's chat template (Tokenize), keeps the longest prefix the
session already holds (Rewind past it if the re-rendered history differs from what
was generated), prefills the rest and decodes the reply. The template is never
written out here, so any model's chat format works.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from clients.python.messages import Sampling, Stopping, Turn, completion_of
from clients.python.sync_client import LadderClient
from proto.ladder.v1 import ladder_pb2 as pb


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class ChatSession:
    """A conversation whose KV lives on the server between turns; `close()` returns it."""

    def __init__(self, client: LadderClient, *, system: str | None = None, max_new_tokens: int = 256,
                 sampling: Sampling | None = None) -> None:
        self.client = client
        self.turns: list[Turn] = [Turn("system", system)] if system else []
        self.max_new_tokens = max_new_tokens
        self.sampling = sampling or Sampling()
        self.session_id = ""
        self.held: list[int] = []  # the token ids the server-side session holds

    def ask(self, question: str, on_text: Callable[[str], None] | None = None) -> pb.Completion:
        """Add a user turn, stream the reply through `on_text`, and return its Completion."""
        self.turns.append(Turn("user", question))
        self._sync_session(self.client.tokenize(self.turns))
        events = self.client.decode(self.session_id, self.max_new_tokens, sampling=self.sampling,
                                    stopping=Stopping(max_new_tokens=self.max_new_tokens))
        completion = completion_of(echo_text(events, on_text))
        self.held = (self.held + list(completion.token_ids))[:completion.session_length]
        self.turns.append(Turn("assistant", completion.text))
        return completion

    def _sync_session(self, wanted: list[int]) -> None:
        """Make the session hold `wanted`: keep the shared prefix, prefill the rest."""
        keep = common_prefix_length(self.held, wanted)
        if keep == len(wanted):
            keep -= 1  # re-run the last token so the session has fresh next-token logits
        if self.session_id and keep < len(self.held):
            self.client.rewind(self.session_id, keep)
        _, done = self.client.prefill([wanted[keep:]], session_id=self.session_id, sampling=self.sampling)
        self.session_id = done.session_id
        self.held = wanted[:done.length]

    def close(self) -> None:
        if self.session_id:
            self.client.close_session(self.session_id)
            self.session_id = ""
            self.held = []


def echo_text(events: Iterable[pb.TokenEvent],
              on_text: Callable[[str], None] | None) -> Iterator[pb.TokenEvent]:
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
    return final[len(shown):] if final.startswith(shown) else ""
