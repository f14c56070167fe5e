"""How the serve process ends: within the drain grace + EXIT_WITHIN_S of SIGTERM, whatever it holds.

After a clean stop the process ends with `exit_now`: atexit handlers run (the process's graph
cache is removed, logs are flushed), then os._exit, skipping the interpreter's teardown. That
teardown frees every object one by one and joins executor threads: after a few hundred compiled
or refused constraints it took a minute, past Kubernetes' 30 s grace (issue #46). A drain that
hangs (a forward that never returns, a thread pool join) is ended by `watchdog` with exit code 1.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn

import structlog

log = structlog.get_logger("ladder.server")
EXIT_WITHIN_S = 5.0  # after the drain grace: the bound the server keeps from SIGTERM to its exit
WATCHDOG_MARGIN_S = 0.5  # the watchdog fires this much before the bound: noticing the signal takes time


def exit_now(code: int) -> NoReturn:
    """End the process with `code` now: atexit handlers run and stdio is flushed, nothing else."""
    try:
        atexit._run_exitfuncs()
    finally:
        _flush()
        os._exit(code)


def watchdog(grace: float) -> threading.Timer:
    """A daemon timer that ends the process (exit code 1) if it is still there `grace` +
    EXIT_WITHIN_S - WATCHDOG_MARGIN_S seconds from now; started when the shutdown begins."""
    seconds = grace + EXIT_WITHIN_S - WATCHDOG_MARGIN_S
    timer = threading.Timer(seconds, _overran, args=(seconds,))
    timer.daemon = True
    timer.start()
    return timer


def _overran(seconds: float) -> None:
    """The shutdown did not end in time: say so and end the process without waiting for anything."""
    log.error("shutdown_overran", seconds=seconds)
    _flush()
    os._exit(1)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a pipe nobody reads any more
            pass
