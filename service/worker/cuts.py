"""A call's cut orders as its job reads them on the worker (`Cuts`): the text's side (service/front/texts.py)
judges each sample's tokens, passing them or cutting at a stop string; the job's body reads the
verdicts (service/worker/generation.py)."""

from __future__ import annotations

from collections.abc import Callable


class Cuts:
    """The door's verdicts per sample, written on the event loop and read by the worker (each a
    single dict store or read: atomic under the GIL). `wake` nudges the worker when a job waits
    on a verdict (`waiting`, set by the worker before it looks again)."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self.cut: dict[int, int] = {}  # sample -> index of the token that completed a stop string
        self.passed: dict[int, int] = {}  # sample -> last index the door passed without a stop
        self.waiting = False
        self._wake = wake

    def passes(self, sample: int, index: int) -> None:
        self.passed[sample] = index
        self._nudge()

    def stops(self, sample: int, index: int) -> None:
        self.cut[sample] = index
        self._nudge()

    def decided(self, sample: int, index: int) -> bool:
        """Whether the door has judged the sample's token `index` (passed it, or cut at or before it)."""
        return self.passed.get(sample, -1) >= index or sample in self.cut

    def judged(self, sample: int, index: int) -> bool:
        """`decided`, on the worker: when not yet, the next verdict wakes it (`waiting` is set
        before the second look, so a verdict landing between the two is not missed)."""
        if self.decided(sample, index):
            return True
        self.waiting = True
        return self.decided(sample, index)

    def _nudge(self) -> None:
        if self.waiting:
            self.waiting = False
            self._wake()
