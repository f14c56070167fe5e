"""Token ids into text where a call is answered, not on the engine worker (issue #42: the core
gives token ids; text and stop strings are the caller's side).

The worker's jobs yield token ids (`TokenOut.text` and `Finished.tail` empty). `TextDoor` turns
each sample's ids into text as its events reach the call: incremental detokenization, then the
stop strings (service/front/stop_text.py). A stop string found is a cut order to the job (`Cuts`,
service/worker/cuts.py):
the worker may have run a step or more past it, so the tokens after the cut are dropped here and
the job ends at its next step; usage counts what the client got.

A job whose session is kept (Decode) with stop strings feeds no token before the door has passed
the one before it (`Verdict`, service/worker/rounds.py), so its session ends as it would had the worker
matched the stop string itself: the token that completed it fed, by the same decode forward, and
nothing after it. A Generate's samples end at the door as soon as their stop string is whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.tokenizer import Tokenizer
from service.calls import Stopping
from service.core.orders import Verdicts
from service.events import Finish, Finished, TokenOut
from service.front.stop_text import StopText


def watches(tokenizer: Tokenizer | None, stopping: Stopping) -> bool:
    """Whether the call looks for stop strings in the text (so its verdicts may cut samples)."""
    return bool(stopping.stop) and tokenizer is not None


@dataclass
class _SampleText:
    stream: Any  # the tokenizer's incremental decoder, or None without a tokenizer
    stop: StopText
    cut: int | None = None  # the index of the token that completed a stop string
    ended: bool = False  # its Finished went out


class TextDoor:
    """One call's samples from token ids to text. `ends_at_cut`: a sample that hits a stop string
    finishes here at once (Generate); else its Finished waits for the job's, which says how long
    the kept session is after the cut (Decode)."""

    def __init__(
        self, tokenizer: Tokenizer | None, stopping: Stopping, cuts: Verdicts, *, ends_at_cut: bool
    ) -> None:
        self.tokenizer = tokenizer
        self.stopping = stopping
        self.cuts = cuts
        self.ends_at_cut = ends_at_cut
        self.watching = watches(tokenizer, stopping)  # whether any cut can come
        self._samples: dict[int, _SampleText] = {}

    def _sample(self, sample: int) -> _SampleText:
        text = self._samples.get(sample)
        if text is None:
            stopping = self.stopping
            stream = self.tokenizer.stream(skip_special=True) if self.tokenizer is not None else None
            stop = StopText(stopping.stop, stopping.include_stop, armed=stopping.min_new_tokens <= 1)
            text = self._samples[sample] = _SampleText(stream, stop)
        return text

    def see(self, events: list[Any]) -> list[Any]:
        """The events with their text, less those after a cut."""
        out: list[Any] = []
        for event in events:
            kind = type(event)
            if kind is TokenOut:
                self._token(event, out)
            elif kind is Finished:
                self._finished(event, out)
            else:
                out.append(event)
        return out

    def _token(self, event: TokenOut, out: list[Any]) -> None:
        text = self._sample(event.sample)
        if text.cut is not None:
            return  # the worker ran past the stop string: not the client's
        stop = text.stop
        if event.index + 1 >= self.stopping.min_new_tokens:  # this token makes min_tokens: armed
            stop.armed = True
        piece = stop.push(text.stream.push(event.id)) if text.stream is not None else ""
        out.append(TokenOut(event.id, piece, event.index, event.at, event.logprobs, event.sample))
        if not self.watching:
            return
        if not stop.stopped:
            self.cuts.passes(event.sample, event.index)
            return
        text.cut = event.index
        self.cuts.stops(event.sample, event.index)
        if self.ends_at_cut:
            text.ended = True
            out.append(Finished(Finish.STOP, "", 0, event.sample))

    def _finished(self, event: Finished, out: list[Any]) -> None:
        text = self._sample(event.sample)
        if text.ended:
            return
        text.ended = True
        if text.cut is not None:
            out.append(Finished(Finish.STOP, "", event.session_length, event.sample))
            return
        stop = text.stop
        tail = "" if text.stream is None else stop.push(text.stream.flush()) + stop.held
        out.append(Finished(event.reason, tail, event.session_length, event.sample))
