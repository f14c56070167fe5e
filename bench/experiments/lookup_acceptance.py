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
from clients.python import LadderClient
from clients.python.messages import Logprobs, Stopping, Turn
from engine.planner.drafts import Lookup

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
