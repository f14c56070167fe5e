"""What refused constraints leave in a served process (issue #46): RSS before, after N distinct
refused regexes (`.{20000}x<k>`, each over the compile budget), after idling, and the time from
SIGTERM to exit.

    python -m bench.experiments.refused_constraints --model DIR --out DIR [--count 200] \
        [--budget 0.1] [--repo PATH]

The server is bench/served.py's (its log in --out/server.log). `--repo` serves from another
checkout (e.g. a worktree of an older commit) with this interpreter, to measure before and after
side by side.
"""

from __future__ import annotations

import argparse
import signal
import time
from pathlib import Path

import grpc

from bench.served import free_port, resolve_model, server_arguments, start_server, stub, wait_serving
from proto.ladder.v1 import ladder_pb2 as pb

REPO = Path(__file__).resolve().parents[2]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        return int(next(line for line in status if line.startswith("VmRSS:")).split()[1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    server_arguments(parser, "cpu", "default", "int4")
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--budget", type=float, default=0.1, help="--constraint-compile-seconds")
    parser.add_argument("--idle", type=float, default=2.0, help="seconds idle before the last reading")
    parser.add_argument("--repo", type=Path, default=None, help="serve from this checkout (default: here)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    process = start_server(
        args,
        resolve_model(args),
        port,
        "--http-port",
        "0",
        "--constraint-compile-seconds",
        str(args.budget),
        root=args.repo,
    )
    try:
        address = f"127.0.0.1:{port}"
        wait_serving(address)
        generate = stub(address).Generate

        def refuse(k: int) -> str:
            request = pb.GenerateRequest(
                prompt=pb.Prompt(text="Hi"),
                constraint=pb.Constraint(regex=f".{{20000}}x{k}"),
                stopping=pb.StoppingOptions(max_new_tokens=2),
            )
            try:
                generate(request, timeout=300)
            except grpc.RpcError as exc:
                return str(exc.code().name)
            return "OK"

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
        print(
            f"repo {args.repo or REPO}: {args.count} refused at a {args.budget:g} s budget in {took:.0f} s "
            f"(codes {sorted(codes)}); RSS {before:.0f} MB before, +{after - before:.0f} MB after, "
            f"+{idle - before:.0f} MB after {args.idle:g} s idle; SIGTERM to exit "
            f"{time.monotonic() - started:.2f} s, exit code {code}"
        )
    finally:
        if process.poll() is None:
            process.kill()


if __name__ == "__main__":
    main()
