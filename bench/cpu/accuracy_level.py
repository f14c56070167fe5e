"""The default int4 model with its MatMulNBits nodes at another accuracy level (a copy of the model
directory, attribute rewritten), beside the model as converted (level 4: int8 activations): prefill of
a 1000-token prompt, 64 decode steps, and the greedy tokens of three random-token prompts.

    python -m bench.cpu.accuracy_level --level 1 [--cache .pytest_cache/d/ladder-default-model]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

from engine.default_model import prepare
from engine.executor import EngineOptions
from engine.executor.engine import DecodeRow, Engine
from engine.sampling import Sampler, SamplingParams


def greedy_tokens(engine: Engine, prompt: list[int], steps: int) -> list[int]:
    """`steps` greedy tokens after `prompt`, on a session of its own."""
    session, greedy = engine.open_session(), Sampler(SamplingParams())
    try:
        engine.append(session, prompt)
        out = [engine.choose(session, greedy)]
        while len(out) < steps:
            token = engine.decode([DecodeRow(session, out[-1], greedy)])[0]
            assert token is not None  # a greedy row always gets its token
            out.append(token)
        return out
    finally:
        engine.close_session(session)


def measure(path: Path, prompts: list[list[int]]) -> tuple[float, float, list[list[int]]]:
    engine = Engine.load(path, EngineOptions(capacity=4096, max_sessions=2))
    tokens = [greedy_tokens(engine, p, 24) for p in prompts]
    session = engine.open_session()
    started = time.perf_counter()
    task = engine.start_prefill(session, prompts[-1])
    while not task.done:
        engine.prefill_step(task)
    prefill = time.perf_counter() - started
    started, token = time.perf_counter(), 5
    for _ in range(64):
        engine.decode_checked([DecodeRow(session, token)])
    return prefill, time.perf_counter() - started, tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--level", type=int, default=1)
    parser.add_argument("--cache", type=Path, default=Path(".pytest_cache/d/ladder-default-model"))
    args = parser.parse_args()
    source = prepare(args.cache, precision="int4").model_dir
    rng = np.random.default_rng(0)
    prompts = [rng.integers(100, 40000, n).tolist() for n in (37, 300, 1000)]
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "model"
        shutil.copytree(source, copy)
        model = onnx.load(str(copy / "model.onnx"))
        for node in model.graph.node:
            for attribute in node.attribute:
                if node.op_type == "MatMulNBits" and attribute.name == "accuracy_level":
                    attribute.i = args.level
        onnx.save(model, str(copy / "model.onnx"))
        results = {"4 (as converted)": measure(source, prompts), str(args.level): measure(copy, prompts)}
    for level, (prefill, decode, _) in results.items():
        print(
            f"accuracy_level {level}: prefill of 1000 tokens {prefill:.2f} s, 64 decode steps {decode:.2f} s"
        )
    base, other = (r[2] for r in results.values())
    print("greedy tokens equal, per prompt:", [a == b for a, b in zip(base, other, strict=True)])


if __name__ == "__main__":
    main()
