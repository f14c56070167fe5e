"""Issue #44: where a verification row first parts from a decode row, node by node.

The load-time probe finds the default model's int4 verification rows ~1.5 nats from its decode rows
on an AVX2 CPU (`verify_gap`), and fp32's 3.6e-5. This runs the model's graph straight through
onnxruntime with every node's output exposed: a 20-token prompt, then one token decoded alone
(one query row), the same token beside another session's (two batch rows) and the same token with
a drafted one after it (two query rows of one session: a verification). For the token's row it
prints the first nodes whose output differs from the one-row decode, and the gap of the logits.

    python -m bench.experiments.verify_gap_origin --model DIR [--out FILE]

DIR: a model directory (genai layout), e.g. .pytest_cache/d/ladder-default-model/models/
smollm2-135m-instruct-int4-ctx4096.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

PROMPT, TOKEN, DRAFT = 20, 123, 456


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--shown", type=int, default=6)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    model = onnx.load(str(args.model / "model.onnx"))
    declared = {o.name for o in model.graph.output}
    nodes = []  # (op, node, output) in graph order
    for node in model.graph.node:
        for name in node.output:
            if name and name not in declared:
                model.graph.output.append(onnx.ValueInfoProto(name=name))
                nodes.append((node.op_type, node.name, name))
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    pasts = [i for i in session.get_inputs() if i.name.startswith("past_key_values.")]
    layers = len(pasts) // 2
    heads, size = pasts[0].shape[1], pasts[0].shape[3]
    vocab = json.loads((args.model / "genai_config.json").read_text())["model"]["vocab_size"]

    def run(ids: np.ndarray, past: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, Any]:
        length = ids.shape[1] + past[0][0].shape[2]
        feed: dict[str, Any] = {
            "input_ids": ids.astype(np.int64),
            "attention_mask": np.ones((ids.shape[0], length), np.int64),
        }
        for i, (key, value) in enumerate(past):
            feed[f"past_key_values.{i}.key"], feed[f"past_key_values.{i}.value"] = key, value
        return dict(zip(names, session.run(None, feed), strict=True))

    empty = [(np.zeros((1, heads, 0, size), np.float32),) * 2 for _ in range(layers)]
    rng = np.random.default_rng(0)
    prompt, other = rng.integers(0, vocab, (1, PROMPT)), rng.integers(0, vocab, (1, PROMPT))
    first, second = run(prompt, empty), run(other, empty)

    def presents(out: dict[str, Any]) -> list[tuple[np.ndarray, np.ndarray]]:
        return [(out[f"present.{i}.key"], out[f"present.{i}.value"]) for i in range(layers)]

    mine, theirs = presents(first), presents(second)
    alone = run(np.array([[TOKEN]]), mine)
    beside = run(
        np.array([[TOKEN], [DRAFT]]),
        [
            (np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))
            for a, b in zip(mine, theirs, strict=True)
        ],
    )
    verified = run(np.array([[TOKEN, DRAFT]]), mine)

    def parting(other: dict[str, Any], row: Any) -> list[dict[str, Any]]:
        found = []
        for op, node, name in nodes:
            a, b = alone[name], other[name]
            if a.ndim < 2 or a.shape[0] != 1 or a.shape[1] != 1:
                continue  # not a per-token tensor of the one-row forward
            x, y = a[0, 0], b[row]
            if x.shape != y.shape:
                continue
            gap = float(np.max(np.abs(x.astype(np.float64) - y)))
            if gap:
                found.append({"op": op, "node": node, "output": name, "gap": gap})
            if len(found) >= args.shown:
                break
        return found

    logits = alone["logits"][0, -1].astype(np.float64)
    result = {
        "model": str(args.model),
        "machine": platform.processor() or platform.machine(),
        "onnxruntime": ort.__version__,
        "logits_gap_beside_another": float(np.max(np.abs(logits - beside["logits"][0, -1]))),
        "logits_gap_verification": float(np.max(np.abs(logits - verified["logits"][0, 0]))),
        "first_parting_beside_another": parting(beside, (0, 0)),
        "first_parting_verification": parting(verified, (0, 0)),
    }
    print(json.dumps(result, indent=1))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
