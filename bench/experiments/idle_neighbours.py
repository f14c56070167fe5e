"""Idle sessions of another client never change an answer (issue #46), through a real server and
the Python client: greedy chat Generate calls with log-probabilities on an idle server, then while
another client holds 1, 3 and 7 idle sessions (opened by Prefill), each compared with the idle
answer: same tokens, bit-equal log-probabilities. Prints GetEngineStats' decode widths and
`rows_moved`.

    python -m bench.experiments.idle_neighbours --out DIR        # the default model in int4, CPU
"""

from __future__ import annotations

import argparse
import json

from bench.served import free_port, machine, resolve_model, server_arguments, start_server, wait_serving
from clients.python import LadderClient
from clients.python.messages import Logprobs, Stopping, Turn

QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "How do I reverse a list in Python?",
    "Name three primary colors.",
    "Why is the sky blue?",
    "Give me a synonym for happy.",
    "What is 17 times 3?",
    "Tell me a fun fact about owls.",
    "Translate 'good morning' into Spanish.",
    "What does a CPU do?",
)


def answers(client: LadderClient, new: int) -> list[tuple[list[int], list[float]]]:
    out = []
    for question in QUESTIONS:
        done = client.generate(
            [Turn("user", question)], stopping=Stopping(max_new_tokens=new), logprobs=Logprobs()
        )
        out.append((list(done.token_ids), [t.logprob for t in done.logprobs]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    server_arguments(parser, "cpu", "default", "int4")
    parser.add_argument("--new", type=int, default=24)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = start_server(args, resolve_model(args), port, "--max-sessions", "8")
    address = f"127.0.0.1:{port}"
    rows = []
    try:
        wait_serving(address)
        asker, holder = LadderClient(address), LadderClient(address)
        idle = answers(asker, args.new)
        held: list[str] = []
        for count in (1, 3, 7):
            while len(held) < count:
                _, done = holder.prefill([[Turn("user", f"Count to {len(held) + 3}.")]])
                held.append(done.session_id)
            got = answers(asker, args.new)
            stats = asker.engine_stats()
            rows.append(
                {
                    "idle_sessions": count,
                    "same_tokens": sum(a[0] == b[0] for a, b in zip(got, idle, strict=True)),
                    "bit_equal_logprobs": sum(a == b for a, b in zip(got, idle, strict=True)),
                    "prompts": len(QUESTIONS),
                    "rows_moved": stats.decode.rows_moved,
                    "decode_widths": {str(w.batch): w.forwards for w in stats.decode.widths},
                }
            )
            print(json.dumps(rows[-1]), flush=True)
        for session_id in held:
            holder.close_session(session_id)
    finally:
        server.terminate()
        server.wait(timeout=60)
    (args.out / "idle_neighbours.json").write_text(json.dumps({"machine": machine(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
