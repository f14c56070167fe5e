"""The one bounded poll: tests wait for a state the server reports, never for an amount of time."""

from __future__ import annotations

import time
from collections.abc import Callable

# A bound, not a pace: generous so a loaded CI machine never reaches it while the state is coming.
WAIT_S = 60.0


def wait_for(condition: Callable[[], object], seconds: float = WAIT_S, what: str = "") -> None:
    """Poll `condition` until it holds; fail the test (saying `what` it waited for) if it does not
    within `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what or 'a condition'}"
        time.sleep(0.005)
