"""Stop strings over streamed text: what may be sent now, and what must wait for the next piece."""

from __future__ import annotations

from collections.abc import Sequence


class StopText:
    """Streams text while holding back any tail that could still begin a stop sequence.

    Linear in the stop strings: per stop, a KMP matcher carries the longest tail of
    the text so far that is a proper prefix of it, advanced by each new piece only.
    """

    def __init__(self, stops: Sequence[str], include: bool = False, armed: bool = True) -> None:
        self.stops = [s for s in stops if s]
        self.include = include  # the stop string itself is sent too (vLLM's include_stop_str_in_output)
        # False while the sample is shorter than min_tokens: no stop string ends it yet (text that may
        # begin one is still held, so one that ends after min_tokens is found whole).
        self.armed = armed
        self._failure = [_failure(s) for s in self.stops]
        self._matched = [0] * len(self.stops)
        self.held = ""
        self.stopped = False

    def push(self, piece: str) -> str:
        text = self.held + piece
        for stop in self.stops if self.armed else ():
            # Only a match that ends in the new piece: one wholly in the held text was passed over
            # while unarmed (armed, any match is cut as soon as it is whole).
            if (cut := text.find(stop, max(0, len(self.held) - len(stop) + 1))) >= 0:
                self.held, self.stopped = "", True
                self._matched = [0] * len(self.stops)
                return text[: cut + len(stop)] if self.include else text[:cut]
        matchers = zip(self.stops, self._failure, self._matched, strict=True)
        self._matched = [_advance(stop, failure, matched, piece) for stop, failure, matched in matchers]
        keep = max(self._matched, default=0)  # never more than `text` holds: see _advance
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]


def _failure(stop: str) -> list[int]:
    """KMP: for each prefix of `stop`, the length of its longest proper border."""
    failure = [0] * len(stop)
    k = 0
    for i in range(1, len(stop)):
        while k and stop[i] != stop[k]:
            k = failure[k - 1]
        if stop[i] == stop[k]:
            k += 1
        failure[i] = k
    return failure


def _advance(stop: str, failure: list[int], matched: int, piece: str) -> int:
    """The longest proper prefix of `stop` the text ends with, after `piece` is appended.

    It grows by at most len(piece), so it always lies within the held tail plus the piece.
    """
    for char in piece:
        while matched and stop[matched] != char:
            matched = failure[matched - 1]
        if stop[matched] == char:
            matched += 1
        if matched == len(stop):  # a whole match: StopText.push finds it first; stay proper
            matched = failure[matched - 1]
    return matched
