"""How many tokens prompt-lookup drafts would save (issue #44, before building verification): greedy
chat answers from a real server (the default model), then each answer replayed through
engine/planner/drafts.py's `Lookup` exactly as a speculating decode would run it: at each step
the draft's longest prefix that the greedy answer continues with is accepted, and the
verification forward also yields the next token. Greedy output with speculation is the output
without it, so the count is exact for this model and these prompts; what a verification forward
of k + 1 rows costs against a one-row step is not measured here.

    python -m bench.experiments.lookup_acceptance --out DIR    # the default model in int4, CPU

Prints, per task and k, tokens per forward (1.0: no draft ever accepted) and the share of steps
that had a draft.
"""

from __future__ import annotations

import argparse
import json

from bench.served import free_port, machine, resolve_model, server_arguments, start_server, wait_serving
from bench.speculation import FREE, GROUNDED
from clients.python import LadderClient
from clients.python.messages import Logprobs, Stopping, Turn
from engine.planner.drafts import Lookup


def replay(prompt: list[int], answer: list[int], k: int) -> dict[str, float]:
    """Forwards a speculating greedy decode would run for `answer` after `prompt`, drafting with k."""
    lookup = Lookup(k=k, tokens=list(prompt))
    at = forwards = drafted = 0
    while at < len(answer):
        draft = lookup.propose()
        drafted += bool(draft)
        accepted = 0
        while (
            accepted < len(draft) and at + accepted < len(answer) and draft[accepted] == answer[at + accepted]
        ):
            accepted += 1
        step = min(accepted + 1, len(answer) - at)  # the accepted tokens and the one the forward chose
        lookup.extend(answer[at : at + step])
        at += step
        forwards += 1
    return {
        "tokens_per_forward": round(len(answer) / max(forwards, 1), 3),
        "steps_with_draft": round(drafted / max(forwards, 1), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    server_arguments(parser, "cpu", "default", "int4")
    parser.add_argument("--new", type=int, default=160)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = start_server(args, resolve_model(args), port, "--max-sessions", "4")
    address = f"127.0.0.1:{port}"
    rows = []
    try:
        wait_serving(address)
        client = LadderClient(address)
        for kind, tasks in (("grounded", GROUNDED), ("free", FREE)):
            for name, text in tasks.items():
                done = client.generate(
                    [Turn("user", text)],
                    stopping=Stopping(max_new_tokens=args.new),
                    logprobs=Logprobs(prompt=True),
                )
                prompt = [p.id for p in done.prompt_logprobs]
                answer = list(done.token_ids)
                row = {"task": name, "kind": kind, "prompt_tokens": len(prompt), "answer_tokens": len(answer)}
                for k in (2, 4, 8):
                    row[f"k{k}"] = replay(prompt, answer, k)
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        server.terminate()
        server.wait(timeout=60)
    (args.out / "lookup_acceptance.json").write_text(
        json.dumps({"machine": machine(), "rows": rows}, indent=1)
    )


if __name__ == "__main__":
    main()
