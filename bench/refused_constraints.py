"""What refused constraints leave in a served process (issue #46): RSS before, after N distinct
refused regexes (`.{20000}x<k>`, each over the compile budget), after idling, and the time from
SIGTERM to exit.

    python -m bench.refused_constraints --model DIR [--count 200] [--budget 0.1] [--repo PATH]

`--repo` serves from another checkout (e.g. a worktree of an older commit) with this
interpreter, to measure before and after side by side.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proto.ladder.v1 import ladder_pb2 as pb
from proto.ladder.v1 import ladder_pb2_grpc
from tests.support.servers import free_port

REPO = Path(__file__).resolve().parents[1]
SERVING = health_pb2.HealthCheckResponse.SERVING


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        return int(next(line for line in status if line.startswith("VmRSS:")).split()[1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--budget", type=float, default=0.1, help="--constraint-compile-seconds")
    parser.add_argument("--idle", type=float, default=2.0, help="seconds idle before the last reading")
    parser.add_argument("--repo", default=str(REPO))
    args = parser.parse_args()
    port = free_port()
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "service", "--model", args.model, "--host", "127.0.0.1",
             "--port", str(port), "--metrics-port", "0", "--http-port", "0",
             "--constraint-compile-seconds", str(args.budget)],
            cwd=args.repo, stdout=subprocess.DEVNULL, stderr=log)
        try:
            channel = grpc.insecure_channel(f"127.0.0.1:{port}")
            grpc.channel_ready_future(channel).result(timeout=120)
            stub = ladder_pb2_grpc.LadderStub(channel)

            def refuse(k: int) -> str:
                request = pb.GenerateRequest(prompt=pb.Prompt(text="Hi"),
                                             constraint=pb.Constraint(regex=f".{{20000}}x{k}"),
                                             stopping=pb.StoppingOptions(max_new_tokens=2))
                try:
                    stub.Generate(request, timeout=300)
                except grpc.RpcError as exc:
                    return str(exc.code().name)
                return "OK"

            health = health_pb2_grpc.HealthStub(channel)
            while health.Check(health_pb2.HealthCheckRequest(), timeout=5).status != SERVING:
                time.sleep(0.5)  # loaded, warming up
            refuse(-1)  # first-use allocations
            before = rss_mb(process.pid)
            started = time.monotonic()
            codes = {refuse(k) for k in range(args.count)}
            took = time.monotonic() - started
            after = rss_mb(process.pid)
            time.sleep(args.idle)
            idle = rss_mb(process.pid)
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=300)
            print(f"repo {args.repo}: {args.count} refused at a {args.budget:g} s budget in {took:.0f} s "
                  f"(codes {sorted(codes)}); RSS {before:.0f} MB before, +{after - before:.0f} MB after, "
                  f"+{idle - before:.0f} MB after {args.idle:g} s idle; SIGTERM to exit "
                  f"{time.monotonic() - started:.2f} s, exit code {code}")
        finally:
            if process.poll() is None:
                process.kill()


if __name__ == "__main__":
    main()
