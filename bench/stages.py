"""Host time of a call, summed by name: a wrapper put in place of a method (an instance's or a
class's), which adds each call's time and changes nothing the call does."""

from __future__ import annotations

import functools
import time
from typing import Any


def timed(totals: dict[str, float], name: str, owner: Any, attr: str) -> None:
    """Replace owner.attr by a wrapper that adds its host time to totals[name]."""
    inner = getattr(owner, attr)

    @functools.wraps(inner)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            totals[name] += time.perf_counter() - start

    setattr(owner, attr, wrapper)
