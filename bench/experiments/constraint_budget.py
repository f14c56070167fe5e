"""Issue #39's burst through a real in-process server: six Generate calls, each with the hostile JSON
schema (30 levels of $defs, each naming the next twice: ~3 KB) and a 2 s deadline, then Tokenize
and a text Generate timed while they compile, then one hostile call alone with a 120 s deadline (time
to refusal), and the process's RSS sampled for `--watch` seconds.

    PYTHONPATH=. .venv/bin/python bench/experiments/constraint_budget.py [--watch 20] [--model-dir DIR]
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

from proto.ladder.v1 import ladder_pb2 as pb
from tests.support.hostile import fanned_schema
from tests.support.models import model_with_tokenizer
from tests.support.servers import RunningServer, server_config


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def timed(call: Any) -> str:
    started = time.perf_counter()
    try:
        call()
        return f"ok {time.perf_counter() - started:.2f}s"
    except grpc.RpcError as exc:
        return f"{exc.code().name} {time.perf_counter() - started:.2f}s"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--watch", type=float, default=20.0)
    parser.add_argument("--model-dir", default="")
    args = parser.parse_args()
    model = Path(args.model_dir) if args.model_dir else model_with_tokenizer(Path(tempfile.mkdtemp()))
    with RunningServer(server_config(model)) as server:
        print(f"rss before {rss_mb():.0f} MB")
        requests = [
            pb.GenerateRequest(
                prompt=pb.Prompt(text="Hi"),
                constraint=pb.Constraint(json_schema=fanned_schema(title=str(i))),
                stopping=pb.StoppingOptions(max_new_tokens=2),
            )
            for i in range(6)
        ]
        peak, stop = [rss_mb()], threading.Event()

        def sample() -> None:
            while not stop.wait(0.1):
                peak.append(rss_mb())

        threading.Thread(target=sample, daemon=True).start()
        with ThreadPoolExecutor(6) as pool:
            calls = [pool.submit(timed, lambda r=r: server.stub.Generate(r, timeout=2.0)) for r in requests]
            time.sleep(0.5)
            print(
                "tokenize while compiling:",
                timed(lambda: server.stub.Tokenize(pb.TokenizeRequest(text="hello ladder"), timeout=30)),
            )
            print(
                "text generate while compiling:",
                timed(
                    lambda: server.stub.Generate(
                        pb.GenerateRequest(
                            prompt=pb.Prompt(text="hello"), stopping=pb.StoppingOptions(max_new_tokens=2)
                        ),
                        timeout=30,
                    )
                ),
            )
            print("hostile calls:", [c.result() for c in calls])
        alone = pb.GenerateRequest(
            prompt=pb.Prompt(text="Hi"),
            constraint=pb.Constraint(json_schema=fanned_schema(title="alone")),
            stopping=pb.StoppingOptions(max_new_tokens=2),
        )
        print("one hostile call, deadline 120 s:", timed(lambda: server.stub.Generate(alone, timeout=120)))
        time.sleep(max(0.0, args.watch - 2.5))
        stop.set()
        print(
            f"rss after {args.watch:.0f} s {rss_mb():.0f} MB; peak sampled {max(peak):.0f} MB; "
            f"ru_maxrss {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB"
        )


if __name__ == "__main__":
    main()
