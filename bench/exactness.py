"""Exactness through real servers on the default model (int4 on CPU), and what the deterministic mode costs.

Each check is a count out of its trials, against a fresh Generate of the same tokens:
- rewind: Prefill, Decode, Rewind to the prompt, Decode again = the first Decode;
- fork: a ForkSession at the prompt's length of a session holding more = fresh;
- one_token_part: the prompt sent as two Prefill parts, the last one token = fresh;
- repeated_1025: a 1,025-token prompt sent twice (the second over its held prefix) = the first;
- racing: greedy Generates sent 8 at a time over a system prompt held by sessions that decoded and
  rewound = a server with sharing off.
Then output tok/s at 1 and `--streams` concurrent Generates, the default and the deterministic
server alternated (`--rounds` times each), and whether the deterministic server's concurrent tokens
equal its tokens alone.

    python -m bench.exactness --out bench/results/exactness-2026-12-01/cpu
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from bench import served
from bench.served import free_port, machine, request, resolve_model, server_arguments, stub, wait_serving
from proto.ladder.v1 import ladder_pb2 as pb

PROMPTS = (
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at a temperature of",
    "My favourite book is",
    "In 1969, the first man to walk on the moon was",
    "The quick brown fox",
    "import numpy as np\n",
    "The best way to learn a language is",
)


@contextmanager
def serving(args: argparse.Namespace, model: str, *flags: str) -> Iterator[Any]:
    port = free_port()
    server = served.start_server(args, model, port, "--max-sessions", str(args.slots), *flags)
    try:
        wait_serving(f"127.0.0.1:{port}")
        yield stub(f"127.0.0.1:{port}")
    finally:
        server.terminate()
        server.wait()


def generate(client: Any, ids: list[int], new: int) -> list[int]:
    return list(client.Generate(request(ids, new)).token_ids)


def prefill(client: Any, *parts: list[int]) -> str:
    messages = [
        pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=p)), last=i == len(parts) - 1)
        for i, p in enumerate(parts)
    ]
    return str(list(client.Prefill(iter(messages)))[-1].done.session_id)


def decode(client: Any, session: str, new: int) -> list[int]:
    events = client.Decode(
        pb.DecodeRequest(session_id=session, stopping=pb.StoppingOptions(max_new_tokens=new, ignore_eos=True))
    )
    return [e.token.id for e in events if e.HasField("token")]


def tokenize(client: Any, text: str) -> list[int]:
    return list(client.Tokenize(pb.TokenizeRequest(text=text)).ids)


def session_paths(client: Any, new: int) -> dict[str, int]:
    counts = {"rewind": 0, "fork": 0, "one_token_part": 0}
    for text in PROMPTS:
        ids = tokenize(client, text)
        fresh = generate(client, ids, new)
        session = prefill(client, ids)
        first = decode(client, session, new)
        client.Rewind(pb.RewindRequest(session_id=session, length=len(ids)))
        counts["rewind"] += decode(client, session, new) == first == fresh
        fork = client.ForkSession(pb.ForkSessionRequest(session_id=session, length=len(ids))).session_id
        counts["fork"] += decode(client, fork, new) == fresh
        parts = prefill(client, ids[:-1], ids[-1:])
        counts["one_token_part"] += decode(client, parts, new) == fresh
        for s in (session, fork, parts):
            client.CloseSession(pb.CloseSessionRequest(session_id=s))
    return counts


def repeated(client: Any, new: int, trials: int) -> int:
    same = 0
    for k in range(trials):
        text = "".join(f"Entry {i} of {k}: the ladder has three widths.\n" for i in range(120))
        ids = tokenize(client, text)[:1025]
        same += generate(client, ids, new) == generate(client, ids, new)
    return same


def racing_prompts(client: Any, count: int) -> tuple[list[int], list[list[int]]]:
    system = tokenize(client, "".join(f"Rule {i}: answer briefly and exactly.\n" for i in range(60)))
    turns = [tokenize(client, f" Question {i}: what is {i} times {i + 3}?") for i in range(count)]
    return system, [system + turn for turn in turns]


def racing(client: Any, system: list[int], prompts: list[list[int]], new: int) -> list[list[int]]:
    for i in range(4):  # holders that decoded past the system prompt and rewound into it
        session = prefill(client, prompts[i])
        decode(client, session, 12)
        client.Rewind(pb.RewindRequest(session_id=session, length=len(system) + 5 * i))
        decode(client, session, 6)
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda p: generate(client, p, new), prompts))


def rate(client: Any, prompts: list[list[int]], new: int) -> tuple[float, list[list[int]]]:
    start = time.perf_counter()
    with ThreadPoolExecutor(len(prompts)) as pool:
        out = list(pool.map(lambda p: generate(client, p, new), prompts))
    return sum(map(len, out)) / (time.perf_counter() - start), out


def cost(
    args: argparse.Namespace, model: str, vocab_prompts: Callable[[Any], list[list[int]]]
) -> dict[str, Any]:
    modes = {"default": ("--deterministic", "false"), "deterministic": ("--deterministic", "true")}
    rates: dict[str, dict[str, list[float]]] = {m: {"1": [], str(args.streams): []} for m in modes}
    equal = {}
    for _ in range(args.rounds):
        for mode, flags in modes.items():
            with serving(args, model, "--prefix-sharing", "false", *flags) as client:
                prompts = vocab_prompts(client)[: args.streams]
                rates[mode]["1"].append(rate(client, prompts[:1], args.cost_new)[0])
                alone = [rate(client, [p], args.cost_new)[1][0] for p in prompts]
                tps, together = rate(client, prompts, args.cost_new)
                rates[mode][str(args.streams)].append(tps)
                equal[mode] = sum(a == b for a, b in zip(alone, together, strict=True))
    best = {m: {k: max(v) for k, v in r.items()} for m, r in rates.items()}
    ratio = {k: best["deterministic"][k] / best["default"][k] for k in best["default"]}
    return {
        "tok_s": rates,
        "best_tok_s": best,
        "deterministic_over_default": ratio,
        "concurrent_equal_alone": equal,
        "streams": args.streams,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    server_arguments(parser, "cpu", "default", "int4")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--new", type=int, default=16)
    parser.add_argument("--racing", type=int, default=160)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--cost-new", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = resolve_model(args)
    result: dict[str, Any] = {
        "machine": machine(),
        "model": args.model,
        "precision": args.precision,
        "command": " ".join(sys.argv),
    }
    with serving(args, model) as client:
        result["session_paths_of_10"] = session_paths(client, args.new)
        result["repeated_1025_of_3"] = repeated(client, args.new, 3)
        system, prompts = racing_prompts(client, args.racing)
        shared = racing(client, system, prompts, args.new)
    with serving(args, model, "--prefix-sharing", "false") as client:
        unshared = [generate(client, p, args.new) for p in prompts]
    result["racing_equal"] = f"{sum(a == b for a, b in zip(shared, unshared, strict=True))} of {len(prompts)}"
    result["cost"] = cost(args, model, lambda c: [tokenize(c, t) for t in PROMPTS])
    print(json.dumps(result, indent=1))
    (args.out / "summary.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
