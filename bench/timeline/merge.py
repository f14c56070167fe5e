"""Median gap before each stage of a request: `python -m bench.timeline.merge CLIENT_LOG SERVER_LOG`.

Reads the "T <stage> <perf_counter>" lines of both logs (see probe.py), cuts them into requests at
each "client_send", drops the first request (warm-up), and prints, for each stage in the order it
first happens, the median time since the stage before it up to the client's first token.
"""

from __future__ import annotations

import re
import statistics
import sys
from collections import defaultdict

LINE = re.compile(r"T (\S+) ([0-9.]+)$")


def main() -> None:
    marks = sorted((float(m.group(2)), m.group(1)) for path in sys.argv[1:]
                   for line in open(path, errors="replace") if (m := LINE.match(line.strip())))
    requests: list[list[tuple[float, str]]] = []
    for at, stage in marks:
        if stage == "client_send":
            requests.append([])
        if requests:
            requests[-1].append((at, stage))
    gaps: dict[str, list[float]] = defaultdict(list)
    order: list[str] = []
    for request in requests[1:]:
        seen, previous = set(), request[0][0]
        for at, stage in request[1:]:
            if stage in seen:
                continue
            seen.add(stage)
            if stage not in order:
                order.append(stage)
            gaps[stage].append((at - previous) * 1e3)
            previous = at
            if stage == "client_first":
                break
    for stage in order:
        print(f"{stage:20s} median {statistics.median(gaps[stage]):8.3f} ms  (n={len(gaps[stage])})")


if __name__ == "__main__":
    main()
