"""Memory that follows the tokens held, and sessions beyond slots, measured on a real server process.

    python -m bench.sessions --out $OUT     # default flags: RSS idle, then a 4,000-token prompt's peak
    python -m bench.sessions --out $OUT --sessions 200 --tokens 500 --server-args "--session-memory-mb 8192"
    python -m bench.sessions --out $OUT --provider cuda --model gpu:16x2048 --precision fp16 --long 0 \
        --sessions 1000 --tokens 1000 --decode 16 --concurrency 64 \
        --server-args "--max-sessions 64 --capacity 2048 --session-memory-mb 65536"

Starts `python -m service` on the default model (SmolLM2-135M int4, 8 KV slots, capacity 4,096
unless --server-args says otherwise) and reads the server process's resident memory (VmRSS) and its
peak (VmHWM) from /proc:

- idle: after the server turns SERVING (the warm-up has run every planned shape);
- long prompt: the peak across one Generate of a `--long`-token prompt (1 new token);
- sessions (with `--sessions N`): N sessions opened by Prefill, `--tokens` tokens each, then each
  continued by one Decode of `--decode` tokens in a seeded random order (`--concurrency` calls in
  flight: aggregate tok/s while resuming, and the engine's unpark time per session from
  GetEngineStats.parking); every Decode's greedy tokens are compared with a fresh Generate of the
  same prompt. RSS after all are open is set against
  idle RSS + held tokens × bytes per token (the engine's KV per position plus each session's
  next-token logits row).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bench.served import (
    free_port,
    machine,
    prompt,
    request,
    resolve_model,
    server_arguments,
    start_server,
    stub,
    wait_serving,
)
from engine.executor.stats import kv_position_bytes
from engine.model import load_model_info
from proto.ladder.v1 import ladder_pb2 as pb


def memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in MiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) // 1024
    return out


def tokens_of(events: Any) -> list[int]:
    return [e.token.id for e in events if e.HasField("token")]


def sessions_run(
    ladder: Any, pid: int, args: argparse.Namespace, vocab: int, idle: int, model: str
) -> dict[str, Any]:
    """Open `args.sessions` sessions, resume each by one Decode in a seeded random order
    (`args.concurrency` at a time), then compare every Decode with a fresh Generate of its prompt."""
    prompts = [prompt(args.tokens, 1000 + i, vocab) for i in range(args.sessions)]

    def open_one(tokens: list[int]) -> str:
        call = pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=tokens)))
        return str(list(ladder.Prefill(iter([call])))[-1].done.session_id)

    def resume(i: int) -> tuple[list[int], float]:
        t0 = time.perf_counter()
        decoded = tokens_of(
            ladder.Decode(
                pb.DecodeRequest(
                    session_id=ids[i],
                    stopping=pb.StoppingOptions(max_new_tokens=args.decode, ignore_eos=True),
                )
            )
        )
        return decoded, time.perf_counter() - t0

    with ThreadPoolExecutor(args.concurrency) as pool:
        started = time.perf_counter()
        ids = list(pool.map(open_one, prompts))
        opened_s = time.perf_counter() - started
        after_open = memory(pid)
        stats = ladder.GetEngineStats(pb.GetEngineStatsRequest())
        order = [int(i) for i in np.random.default_rng(0).permutation(args.sessions)]
        started = time.perf_counter()
        resumed = dict(zip(order, pool.map(resume, order), strict=True))
        resume_s = time.perf_counter() - started
        after = ladder.GetEngineStats(pb.GetEngineStatsRequest())
        fresh = list(
            pool.map(lambda tokens: tokens_of(ladder.GenerateStream(request(tokens, args.decode))), prompts)
        )
    equal = sum(resumed[i][0] == fresh[i] for i in range(args.sessions))
    for session_id in ids:
        ladder.CloseSession(pb.CloseSessionRequest(session_id=session_id))
    info = load_model_info(Path(model))
    held = args.sessions * (args.tokens * kv_position_bytes(info) + info.vocab_size * 4)
    expected_mib = idle + held / 2**20
    waits = [r[1] for r in resumed.values()]
    unparks = after.parking.unparks - stats.parking.unparks
    return {
        "sessions": args.sessions,
        "tokens_each": args.tokens,
        "all_accepted": len(ids) == args.sessions,
        "concurrency": args.concurrency,
        "open_seconds": round(opened_s, 2),
        "rss_after_open_mib": after_open["VmRSS"],
        "rss_expected_mib": round(expected_mib, 1),
        "rss_over_expected": round(after_open["VmRSS"] / expected_mib, 3),
        "sessions_open_after_open": int(stats.sessions_open),
        "sessions_parked_after_open": int(stats.parking.sessions_parked),
        "parked_mib_after_open": round(stats.parking.parked_bytes / 2**20, 1),
        "device_kv_and_weights_mib": round(stats.memory.total_bytes / 2**20, 1),
        "decode_equal_to_fresh": f"{equal}/{args.sessions}",
        "resume_seconds": round(resume_s, 2),
        "resume_tok_s": round(args.sessions * args.decode / resume_s, 1),
        "resume_decode_ms_p50": round(1e3 * float(np.percentile(waits, 50)), 1),
        "resume_decode_ms_p99": round(1e3 * float(np.percentile(waits, 99)), 1),
        "unparks_while_resuming": unparks,
        "unpark_ms_per_session": round(
            1e3 * (after.parking.unpark_seconds - stats.parking.unpark_seconds) / max(unparks, 1), 3
        ),
        "park_ms_per_session": round(1e3 * after.parking.park_seconds / max(after.parking.parks, 1), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    server_arguments(parser, provider="cpu", model="default", precision="int4")
    parser.add_argument("--server-args", default="", help="more `python -m service` flags")
    parser.add_argument("--long", type=int, default=4000)
    parser.add_argument("--sessions", type=int, default=0)
    parser.add_argument("--tokens", type=int, default=500)
    parser.add_argument("--decode", type=int, default=4)
    parser.add_argument(
        "--concurrency", type=int, default=1, help="calls in flight while opening and resuming"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = resolve_model(args)
    args.port = free_port()
    server = start_server(args, model, args.port, "--max-queue", "1024", *args.server_args.split())
    try:
        address = f"127.0.0.1:{args.port}"
        wait_serving(address)
        ladder = stub(address)
        vocab = int(ladder.GetModelInfo(pb.GetModelInfoRequest()).vocab_size)
        time.sleep(1.0)
        idle = memory(server.pid)
        Path(f"/proc/{server.pid}/clear_refs").write_text("5")  # VmHWM from here: each phase's own peak
        report: dict[str, Any] = {
            "machine": machine(),
            "command": " ".join(sys.argv),
            "model": model,
            "server_args": args.server_args,
            "idle_mib": idle,
        }
        if args.long:
            tokens_of(ladder.GenerateStream(request(prompt(args.long, 7, vocab), 1)))
            report["long_prompt"] = {"tokens": args.long, **memory(server.pid)}
        if args.sessions:
            report["sessions"] = sessions_run(ladder, server.pid, args, vocab, idle["VmRSS"], model)
        (args.out / "sessions.json").write_text(json.dumps(report, indent=2) + "\n")
        print(json.dumps({k: v for k, v in report.items() if k != "machine"}, indent=2))
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
