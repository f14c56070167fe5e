"""Every garbage collection's pause, per generation, in any Python process started with this folder on
PYTHONPATH (that is the opt-in: bench-only, nothing else imports it). At exit the process writes
/tmp/ladder-gc-pauses.<pid>.json: its argv, the live objects the collector tracks, and per
generation the number of collections, their total, p99 and longest pause in ms.

    PYTHONPATH=$PWD/bench/gc_pauses python -m bench.serving ...

(A server exits through atexit after SIGTERM's drain, so its file is written.)
"""

import atexit
import gc
import json
import os
import sys
import time

PREFIX = "/tmp/ladder-gc-pauses"


def _install(prefix: str) -> None:
    started: list[float] = [0.0]
    pauses: dict[int, list[float]] = {}

    def timed(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.setdefault(info["generation"], []).append(time.perf_counter() - started[0])

    def write() -> None:
        summary = {
            str(g): {
                "collections": len(v),
                "total_ms": 1e3 * sum(v),
                "p99_ms": 1e3 * sorted(v)[int(0.99 * (len(v) - 1))],
                "max_ms": 1e3 * max(v),
            }
            for g, v in sorted(pauses.items())
        }
        with open(f"{prefix}.{os.getpid()}.json", "w") as out:
            json.dump({"argv": sys.argv, "tracked_objects": len(gc.get_objects()), "pauses": summary}, out)

    gc.callbacks.append(timed)
    atexit.register(write)


_install(PREFIX)
