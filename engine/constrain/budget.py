"""A compile's allowance: CPU seconds of the compiling thread, and a flag its caller sets on leaving.

The compiler checks it in its hot loops (json_schema.py's subschemas, nfa.py's states, dfa.py's
subsets, the first mask): past the allowance OverBudget (the request's fault: a constraint too
costly to compile, CONSTRAINT_TOO_LARGE), once abandoned Abandoned (nobody waits for the result:
not an error to remember). Time is the thread's CPU time (time.thread_time), started by the
compiling thread: a busy machine or the GIL slows a compile without spending its allowance, so
the same constraint is refused, or not, whatever the load.
"""

from __future__ import annotations

import threading
import time

CHECK_EVERY = 64  # ticks between two reads of the clock (~0.7 µs each): a tick is a few µs of work


class OverBudget(Exception):
    """The compile spent its CPU allowance."""


class Abandoned(Exception):
    """Every caller waiting for the compile has left."""


class Budget:
    """`seconds` of the compiling thread's CPU time (None: unbounded) and the abandon flag."""

    def __init__(self, seconds: float | None = None) -> None:
        self.seconds = seconds
        self._abandoned = threading.Event()
        self._started: float | None = None
        self._ticks = 0

    def start(self) -> None:
        """Start the clock on the thread that compiles (CPU time is counted per thread)."""
        self._started = time.thread_time()
        self._ticks = 0

    def abandon(self) -> None:
        """The caller left: the compile stops at its next check (safe from any thread)."""
        self._abandoned.set()

    @property
    def abandoned(self) -> bool:
        return self._abandoned.is_set()

    def tick(self) -> None:
        """A unit of work done: check now and then (cheap enough for an inner loop)."""
        self._ticks += 1
        if self._ticks % CHECK_EVERY == 0:
            self.check()

    def check(self) -> None:
        """Raise Abandoned or OverBudget where the compile should stop."""
        if self._abandoned.is_set():
            raise Abandoned("the compile was abandoned: its callers left")
        if self.seconds is None:
            return
        if self._started is None:
            self.start()
        elif time.thread_time() - self._started > self.seconds:
            raise OverBudget(
                f"compiling it took more than the {self.seconds:g} s of CPU time a "
                "constraint may take (--constraint-compile-seconds)"
            )


class Steps(Budget):
    """At most `steps` ticks: a count, not a clock, so a part of a compile that may give up (and
    take a fallback) gives up alike on every machine and under any load."""

    def __init__(self, steps: int) -> None:
        super().__init__()
        self.left = steps

    def tick(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise OverBudget("past its steps")


UNBOUNDED = Budget()  # never started, never abandoned: what a compile without a caller's budget gets
