"""One stream's decode speed with and without speculative decoding (issue #44), side by side: two
servers on the same model, one `--speculate off`, one `--speculate lookup`, each task's greedy chat
request sent to one then the other, `--rounds` times, alternating which goes first. Decode tok/s
is (tokens - 1) over the time from the first token to the last (Completion.timing), so prefill is
left out; the medians are compared, and whether every pair's tokens are equal is reported.

    python -m bench.speculation --out DIR [--precision fp32|int4] [--rounds 3] [--new 160]

Input-grounded tasks (the answer quotes the prompt) and free generation (those
bench/experiments/lookup_acceptance.py replayed), and JSON under a 10-property schema, whose forced tokens
(keys, quotes, braces) are drafts that are always kept: decode forwards per token below 1.
Writes DIR/speculation-<precision>.json (every run, each server's
speculation counters) and prints one line per task.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from bench.served import free_port, machine, resolve_model, server_arguments, start_server, stub, wait_serving
from proto.ladder.v1 import ladder_pb2 as pb

# The tasks (also bench/experiments/lookup_acceptance.py's): the answer quotes the prompt, or not.
PASSAGE = (
    "Maria Lopez moved from Seville to Lyon in 2019 to work at a small bakery on Rue Victor Hugo. "
    "Her brother Daniel Lopez stayed in Seville, where he runs a bicycle repair shop near the river. "
    "In 2022 Maria opened her own bakery, Pan de Casa, with her friend Akira Sato from Osaka. "
    "They sell sourdough bread, almond cakes and a cinnamon roll that customers queue for on Sundays."
)
CODE = (
    "def total(items):\n    x = 0\n    for item in items:\n        x = x + item.price * item.quantity\n"
    "    return x\n"
)
GROUNDED = {
    "repeat": f"Repeat the following text exactly, word for word:\n\n{PASSAGE}",
    "extract": f"List every person in this text with their city, as JSON objects with the keys "
    f'"name" and "city":\n\n{PASSAGE}',
    "rewrite": f"Rewrite this text in the present tense:\n\n{PASSAGE}",
    "summarize": f"Summarize this text in two sentences:\n\n{PASSAGE}",
    "code-edit": f"Rename the variable x to running_total in this Python function and show the whole "
    f"function:\n\n{CODE}",
}
FREE = {
    "story": "Write a short story about a robot who learns to paint.",
    "explain": "Explain how a rainbow forms.",
    "list": "Give me ten ideas for a rainy afternoon.",
}

# A 10-property JSON Schema (issue #44: forwards per output token < 1 where the schema forces its keys).
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "city": {"type": "string"},
        "country": {"type": "string"},
        "year_moved": {"type": "integer"},
        "employer": {"type": "string"},
        "street": {"type": "string"},
        "sibling": {"type": "string"},
        "sibling_city": {"type": "string"},
        "business": {"type": "string"},
        "partner": {"type": "string"},
    },
    "required": [
        "name",
        "city",
        "country",
        "year_moved",
        "employer",
        "street",
        "sibling",
        "sibling_city",
        "business",
        "partner",
    ],
    "additionalProperties": False,
}
CONSTRAINED = {"json-10": f"Describe Maria Lopez from this text as JSON:\n\n{PASSAGE}"}


def _request(text: str, new: int, kind: str) -> pb.GenerateRequest:
    constraint = pb.Constraint(json_schema=json.dumps(SCHEMA)) if kind == "json" else None
    return pb.GenerateRequest(
        prompt=pb.Prompt(chat=pb.Chat(messages=[pb.ChatMessage(role="user", content=text)])),
        stopping=pb.StoppingOptions(max_new_tokens=new),
        constraint=constraint,
    )


def _decode_rate(done: pb.Completion) -> float:
    seconds = (done.timing.total_ms - done.timing.ttft_ms) / 1e3
    return (len(done.token_ids) - 1) / seconds if seconds > 0 else 0.0


def _counters(address: str) -> dict[str, int]:
    d = stub(address).GetEngineStats(pb.GetEngineStatsRequest()).decode
    return {
        "decode_forwards": d.steps,
        "verify_forwards": d.verify_forwards,
        "drafted": d.drafted_tokens,
        "accepted": d.accepted_tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    server_arguments(parser, "cpu", "default", "fp32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new", type=int, default=160)
    parser.add_argument("--speculate-tokens", type=int, default=4)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    model = resolve_model(args)
    ports = {"off": free_port(), "lookup": free_port()}
    flags = ("--max-sessions", "2", "--speculate-tokens", str(args.speculate_tokens))
    servers = {
        mode: start_server(args, model, port, "--speculate", mode, *flags, log=f"server-{mode}.log")
        for mode, port in ports.items()
    }
    addresses = {mode: f"127.0.0.1:{port}" for mode, port in ports.items()}
    rows: list[dict[str, Any]] = []
    try:
        for address in addresses.values():
            wait_serving(address)
        stubs = {mode: stub(address) for mode, address in addresses.items()}
        for kind, tasks in (("grounded", GROUNDED), ("free", FREE), ("json", CONSTRAINED)):
            for name, text in tasks.items():
                rates: dict[str, list[float]] = {"off": [], "lookup": []}
                forwards = {"off": 0, "lookup": 0}
                equal, tokens = True, 0
                for r in range(args.rounds):
                    order = ("off", "lookup") if r % 2 == 0 else ("lookup", "off")
                    done = {}
                    for mode in order:
                        before = _counters(addresses[mode])
                        done[mode] = stubs[mode].Generate(_request(text, args.new, kind))
                        after = _counters(addresses[mode])
                        forwards[mode] += sum(
                            after[c] - before[c] for c in ("decode_forwards", "verify_forwards")
                        )
                        rates[mode].append(_decode_rate(done[mode]))
                    equal = equal and list(done["off"].token_ids) == list(done["lookup"].token_ids)
                    tokens = len(done["off"].token_ids)
                off, on = (statistics.median(rates[m]) for m in ("off", "lookup"))
                row = {
                    "task": name,
                    "kind": kind,
                    "tokens": tokens,
                    "off_tok_s": round(off, 1),
                    "lookup_tok_s": round(on, 1),
                    "speedup": round(on / off, 3) if off else None,
                    "same_tokens": equal,
                    # decode and verification forwards per token after the first (the prefill's)
                    "forwards_per_token": {
                        m: round(f / max(args.rounds * (tokens - 1), 1), 3) for m, f in forwards.items()
                    },
                    "runs": rates,
                }
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "runs"}), flush=True)
        counters = {mode: _counters(address) for mode, address in addresses.items()}
    finally:
        for server in servers.values():
            server.terminate()
            server.wait(timeout=60)
    result = {
        "machine": machine(),
        "model": model,
        "precision": args.precision,
        "speculate_tokens": args.speculate_tokens,
        "rounds": args.rounds,
        "rows": rows,
        "counters": counters,
    }
    (args.out / f"speculation-{args.precision}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(counters))


if __name__ == "__main__":
    main()
