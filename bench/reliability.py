"""Reliability under sustained overload: many streams for minutes over fewer KV slots, through the service.

Starts `python -m service` on a generated model and keeps `--streams` GenerateStream calls going at once
(random prompt lengths and output lengths, each with a generous deadline) over a server with `--slots`
KV slots, for `--seconds`. Counts every call's ending, samples the server's RSS and engine stats, and at
the end checks that no session is left open. A call that passes its deadline is counted as hung.

    python -m bench.reliability --seconds 600 --streams 64 --slots 32 --out bench/results/reliability-<date>
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc

from bench.served import free_port, machine, request, rss, stub, wait_serving


def client(args: tuple[str, int, float, int, int]) -> dict[str, Any]:
    """One client process: `threads` streams, each starting a new call as soon as the last ended."""
    from concurrent.futures import ThreadPoolExecutor

    address, threads, until, vocab, seed = args

    def loop(index: int) -> Counter[str]:
        rng, ladder, codes = random.Random(seed * 1000 + index), stub(address), Counter[str]()
        while time.time() < until:
            tokens = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 400))]
            try:
                for _event in ladder.GenerateStream(request(tokens, rng.randint(1, 64)), timeout=30):
                    pass
                codes["OK"] += 1
            except grpc.RpcError as error:
                codes[error.code().name] += 1
        return codes

    with ThreadPoolExecutor(threads) as pool:
        total: Counter[str] = sum(pool.map(loop, range(threads)), Counter())
    return dict(total)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--warm-up-s", type=float, default=60)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from engine.convert.tokenizer_json import write_byte_level_tokenizer
    from engine.modelgen.synthetic import TINY, build_synthetic

    model = build_synthetic(TINY, Path(tempfile.mkdtemp()))
    write_byte_level_tokenizer(model, TINY.vocab_size)
    port = free_port()
    address = f"127.0.0.1:{port}"
    cmd = [
        sys.executable,
        "-m",
        "service",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--metrics-port",
        "0",
        "--max-sessions",
        str(args.slots),
        "--max-queue",
        str(4 * args.streams),
        "--max-new-tokens",
        "64",
        "--log-level",
        "warning",
    ]
    import subprocess

    server = subprocess.Popen(cmd, stdout=open(args.out / "server.log", "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    samples: list[dict[str, Any]] = []
    try:
        wait_serving(address)
        started = time.time()
        until = started + args.seconds
        per = args.streams // args.processes
        with mp.get_context("spawn").Pool(args.processes) as pool:
            pending = pool.map_async(
                client, [(address, per, until, TINY.vocab_size, p) for p in range(args.processes)]
            )
            while not pending.ready():
                stats = stub(address).GetEngineStats(pb_request())
                samples.append(
                    {
                        "t": round(time.time() - started, 1),
                        "rss": rss(server.pid),
                        "sessions_open": stats.sessions_open,
                        "queue_depth": stats.queue_depth,
                        "decode_rows_per_step": stats.decode.rows / max(stats.decode.steps, 1),
                    }
                )
                pending.wait(10)
            codes = sum((Counter(c) for c in pending.get()), Counter())
        time.sleep(1)
        final = stub(address).GetEngineStats(pb_request())
    finally:
        server.terminate()
        exit_code = server.wait(120)
    steady = [s["rss"] for s in samples if s["t"] >= args.warm_up_s]
    result = {
        "machine": machine(),
        "command": " ".join(sys.argv),
        "settings": vars(args) | {"out": str(args.out)},
        "calls": dict(codes),
        "hung": codes.get("DEADLINE_EXCEEDED", 0),
        "failed": sum(n for code, n in codes.items() if code != "OK"),
        "sessions_open_at_end": final.sessions_open,
        "queue_depth_at_end": final.queue_depth,
        "rss_after_warm_up": rss_spread(steady),
        "samples": samples,
        "server_exit_code": exit_code,
    }
    (args.out / "reliability.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=2))


def rss_spread(values: list[int]) -> dict[str, float] | None:
    if not values:
        return None
    low, high = min(values), max(values)
    return {"min": low, "max": high, "spread_pct": 100 * (high - low) / low}


def pb_request() -> Any:
    from proto.ladder.v1 import ladder_pb2 as pb

    return pb.GetEngineStatsRequest()


if __name__ == "__main__":
    main()
