"""Forks whose deadline ends about when the core answers: does any stay open? (a4f4182)

Against a running server behind a frontend (`ladder serve --frontends 1`): one source session, its
fork's own time (the median of 20 answered forks), then COUNT ForkSession calls with deadlines from
0.2x to 1.5x that time, each fork whose answer came closed at once. Some forks stay open by design:
the server sent the answer (the call ended OK there) as the client's deadline fired, the gap a
named fork (`fork_id`) closes (docs/api.md). Those are the server's OK calls (its
ladder_calls_total, read from /metrics) beyond the client's. Any other fork left open is one the
server never delivered yet did not close: `undelivered_left_open`, which must be 0.

    python -m bench.experiments.fork_deadlines --address 127.0.0.1:50071 \
        --metrics http://127.0.0.1:9464/metrics [--count 300] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import urllib.request
from collections import Counter
from pathlib import Path

import grpc

from proto.ladder.v1 import ladder_pb2 as pb
from proto.ladder.v1 import ladder_pb2_grpc


def sessions_open(stub: ladder_pb2_grpc.LadderStub) -> int:
    stats: pb.EngineStats = stub.GetEngineStats(pb.GetEngineStatsRequest())
    return stats.sessions_open


def forks_answered(metrics: str) -> int:
    """ForkSession calls the server ended OK (its answer sent), every frontend's counted."""
    wanted = 'ladder_calls_total{code="OK",method="ForkSession",protocol="grpc"}'
    with urllib.request.urlopen(metrics, timeout=10) as page:
        for line in page.read().decode().splitlines():
            if line.startswith(wanted):
                return int(float(line.split()[-1]))
    return 0


def run(address: str, metrics: str, count: int) -> dict[str, object]:
    stub = ladder_pb2_grpc.LadderStub(grpc.insecure_channel(address))
    before, answered = sessions_open(stub), forks_answered(metrics)
    prompt = pb.PrefillRequest(prompt=pb.Prompt(text="The capital of France is"), last=True)
    source = [part.done.session_id for part in stub.Prefill(iter([prompt])) if part.HasField("done")][0]
    took = []
    for _ in range(20):  # the fork's own time, answered: deadlines are spread around it
        start = time.perf_counter()
        fork = stub.ForkSession(pb.ForkSessionRequest(session_id=source))
        took.append(time.perf_counter() - start)
        stub.CloseSession(pb.CloseSessionRequest(session_id=fork.session_id))
    median = statistics.median(took)
    codes: Counter[str] = Counter()
    for i in range(count):
        timeout = median * (0.2 + 1.3 * (i % 30) / 29)
        try:
            fork = stub.ForkSession(pb.ForkSessionRequest(session_id=source), timeout=timeout)
            stub.CloseSession(pb.CloseSessionRequest(session_id=fork.session_id))
            codes["OK"] += 1
        except grpc.RpcError as error:
            codes[error.code().name] += 1
    deadline = time.monotonic() + 5.0  # a fork not taken is closed within a round or two
    while (now := sessions_open(stub)) != before + 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    stub.CloseSession(pb.CloseSessionRequest(session_id=source))
    left_open = now - before - 1
    lost = forks_answered(metrics) - answered - len(took) - codes["OK"]  # sent, not received in time
    return {
        "fork_ms": round(median * 1000, 3),
        "forks": count,
        "codes": dict(codes),
        "left_open": left_open,
        "answers_sent_not_received": lost,
        "undelivered_left_open": left_open - lost,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--address", required=True)
    parser.add_argument("--metrics", required=True, help="the server's /metrics URL")
    parser.add_argument("--count", type=int, default=300)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = run(args.address, args.metrics, args.count)
    print(json.dumps(result))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
