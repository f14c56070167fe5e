"""Median time of each stage of a request: `python -m bench.timeline.merge CLIENT_JSONL SERVER_LOG`.

Lines up the probe's client lines (wall-clock send and first event, per request id) with the
server's debug log (JSON lines stamped with the same wall clock): the access line gives the call's
arrival (its stamp less `duration_ms`), its start on the worker (`queue_ms` later) and its first
token (`ttft_ms` after arrival); the `prefill_forward` lines of the same request id give each
forward's end (its stamp) and length (`ms`). The warm-up request (probe-0) is left out.
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
import sys
from collections import defaultdict
from typing import Any

Span = tuple[float, float]  # a forward's start and end, seconds since the epoch
STAGES = (
    ("client sends -> interceptor entry (gRPC's way in)", "way_in"),
    ("-> job started on the worker (queue_ms)", "queue"),
    ("-> first prefill forward starts", "to_forward"),
    ("prefill forwards, summed", "forwards"),
    ("between those forwards", "between"),
    ("last forward ends -> server's first token", "to_token"),
    ("-> the client has it (the way out)", "way_out"),
)


def stamp(line: dict[str, Any]) -> float:
    """A structlog ISO timestamp as seconds since the epoch (the client's time.time())."""
    return dt.datetime.fromisoformat(line["timestamp"].replace("Z", "+00:00")).timestamp()


def server_lines(path: str) -> tuple[dict[str, dict[str, Any]], dict[str, list[Span]]]:
    """Each request id's access line, and its prefill forwards as (start, end) in seconds."""
    calls: dict[str, dict[str, Any]] = {}
    forwards: dict[str, list[Span]] = defaultdict(list)
    for text in open(path, errors="replace"):
        if not text.startswith("{"):
            continue
        line = json.loads(text)
        if line.get("event") == "rpc" and line.get("request_id"):
            calls[line["request_id"]] = line
        elif line.get("event") == "prefill_forward":
            end = stamp(line)
            forwards[line["request_id"]].append((end - line["ms"] / 1e3, end))
    return calls, forwards


def stages(client: dict[str, Any], call: dict[str, Any], forwards: list[Span]) -> dict[str, float]:
    """One request's stage times, in seconds (and its count of forwards before the first token)."""
    arrived = stamp(call) - call["duration_ms"] / 1e3
    started = arrived + call["queue_ms"] / 1e3
    first_token = arrived + call["ttft_ms"] / 1e3
    before = [f for f in forwards if f[1] <= first_token] or forwards
    spent = sum(end - start for start, end in before)
    return {
        "way_in": arrived - client["client_send"],
        "queue": started - arrived,
        "to_forward": before[0][0] - started,
        "forwards": spent,
        "between": before[-1][1] - before[0][0] - spent,
        "to_token": first_token - before[-1][1],
        "way_out": client["client_first"] - first_token,
        "count": len(before),
    }


def main() -> None:
    clients = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    calls, forwards = server_lines(sys.argv[2])
    rows = [
        stages(c, calls[c["request_id"]], forwards[c["request_id"]])
        for c in clients
        if c["request_id"] != "probe-0"
    ]
    for title, key in STAGES:
        print(f"{title:52s} median {statistics.median(r[key] for r in rows) * 1e3:8.3f} ms")
    count = statistics.median(r["count"] for r in rows)
    print(f"{'prefill forwards before the first token':52s} median {count:8.0f}    (n={len(rows)} requests)")


if __name__ == "__main__":
    main()
