"""What structured output costs: constraint compile times, and decode steps with constrained rows
beside the same steps without, measured side by side in one process on the engine itself.

    python -m bench.structured --model default --provider cpu --streams 1,8 --out $OUT
    python -m bench.structured --model gpu:16x2048 --provider cuda --streams 16,64 --out $OUT

For each stream count S it opens S sessions, prefills a prompt on each, then runs `--tokens`
greedy decode steps in three modes, interleaved `--repeats` times (A B C A B C ...): no row
constrained, half the rows constrained, every row constrained. A constrained row follows a
10-property JSON Schema and starts it again whenever its output completes, so every token is
a constrained one. Every state's mask is computed first, as the server does on a thread of its
own right after compiling (service/core/constraints.py): the figures are a served schema's steady
state. The figure is output tokens per second of the decode steps (Engine.step with
every row in one forward, the path the server takes) and its ratio to the unconstrained mode.

A model without a tokenizer (the synthetic GPU decoders) gets a byte-level vocabulary of its
width: the 256 single bytes, then seeded ASCII pieces of 2-8 bytes (the mask work scales with the
vocabulary's size and piece lengths, not with what the pieces mean).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.served import machine, resolve_model, server_arguments
from engine.constrain.compiled import Compiled, compile_constraint
from engine.constrain.vocabulary import Vocabulary
from engine.executor import EngineOptions
from engine.executor.engine import Engine
from engine.executor.step import DecodeRow, Step
from engine.sampling import Sampler, SamplingParams

SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": "string", "maxLength": 24},
        "email": {"type": "string", "format": "email"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "active": {"type": "boolean"},
        "role": {"enum": ["admin", "user", "guest"]},
        "score": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
        "created": {"type": "string", "format": "date"},
        "note": {"type": ["string", "null"], "maxLength": 40},
    },
    "required": ["id", "name", "email", "age", "active", "role"],
    "additionalProperties": False,
}
SCHEMAS = {
    "closed": SCHEMA,
    "open": {k: v for k, v in SCHEMA.items() if k != "additionalProperties"},
    "object": {"type": "object"},
}
MODES = ("none", "half", "all")


def synthetic_vocabulary(size: int, eos: tuple[int, ...], seed: int = 0) -> Vocabulary:
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(
        b'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 "{}:,.-_', np.uint8
    )
    pieces: list[bytes | None] = [bytes([i]) for i in range(min(size, 256))]
    for _ in range(size - len(pieces)):
        pieces.append(bytes(rng.choice(letters, int(rng.integers(2, 9)))))
    return Vocabulary(pieces, size, eos)


def vocabulary(model: Path, engine: Engine) -> Vocabulary:
    facts = engine.facts
    if (model / "tokenizer.json").exists():
        from engine.tokenizer import Tokenizer

        return Vocabulary.from_tokenizer(Tokenizer(model), facts.vocab_size, facts.eos_ids)
    return synthetic_vocabulary(facts.vocab_size, facts.eos_ids)


def compile_times(vocab: Vocabulary, repeats: int) -> dict[str, float]:
    """Compile + first mask of the schema (fresh each time), and a cached state's mask."""
    text = json.dumps(SCHEMA)
    fresh = []
    for _ in range(repeats):
        started = time.perf_counter()
        compiled = compile_constraint("json_schema", text, vocab)
        compiled.start().allowed()
        fresh.append(time.perf_counter() - started)
    row = compiled.start()
    started = time.perf_counter()
    for _ in range(100):
        row.allowed()
    return {
        "compile_and_first_mask_ms": statistics.median(fresh) * 1e3,
        "cached_mask_ms": (time.perf_counter() - started) * 10,
    }


class Stream:
    def __init__(self, engine: Engine, prompt: list[int], compiled: Compiled | None) -> None:
        self.session = engine.open_session()
        engine.append(self.session, prompt)
        self.compiled = compiled
        self.sampler = Sampler(SamplingParams(), constraint=compiled.start() if compiled else None)
        self.token = engine.choose(self.session, self.sampler)
        self.restarts = 0

    def row(self) -> DecodeRow:
        constraint = self.sampler.constraint
        if self.compiled is not None and (
            constraint is None or constraint.done or self.token in self.compiled_eos
        ):
            self.sampler.constraint = self.compiled.start()  # a new object: every token constrained
            self.restarts += 1
        return DecodeRow(self.session, self.token, self.sampler)

    compiled_eos: frozenset[int] = frozenset()


class Parts:
    """Host seconds spent in named methods of the engine's parts (`--time-parts`): each method is
    wrapped on its instance, so what a step spends where is measured on the real path."""

    def __init__(self, engine: Engine) -> None:
        self.seconds: dict[str, float] = {}
        backend = engine.backend
        targets = [
            (backend, "run_batch"),
            (backend, "keep_batch"),
            (backend, "choose"),
            (backend, "settle"),
            (engine, "choose_rows"),
        ]
        masks = getattr(backend, "masks", None)
        if masks is not None:
            targets.append((masks, "slot"))
        rt = getattr(backend, "rt", None)
        if rt is not None and hasattr(rt, "to_host"):
            targets.append((rt, "to_host"))
        for owner, name in targets:
            self._wrap(owner, name)

    def _wrap(self, owner: Any, name: str) -> None:
        inner = getattr(owner, name)
        label = f"{type(owner).__name__}.{name}"

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - started

        setattr(owner, name, timed)

    def take(self, steps: int) -> dict[str, float]:
        """Milliseconds per step of each part since the last take."""
        taken, self.seconds = self.seconds, {}
        return {label: round(s / steps * 1e3, 4) for label, s in sorted(taken.items())}


def run_mode(
    engine: Engine,
    streams: int,
    tokens: int,
    prompt: int,
    mode: str,
    compiled: Compiled,
    eos: frozenset[int],
    seed: int,
    parts: Parts | None = None,
) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    constrained = {"none": 0, "half": streams // 2, "all": streams}[mode]
    group = []
    for i in range(streams):
        ids = [int(t) for t in rng.integers(3, min(engine.facts.vocab_size, 30000), prompt)]
        stream = Stream(engine, ids, compiled if i < constrained else None)
        stream.compiled_eos = eos
        group.append(stream)
    try:
        if parts is not None:
            parts.take(1)  # what opening and prefilling spent is not the steps'
        started = time.perf_counter()
        mask_seconds = 0.0
        for _ in range(tokens):
            rows = [s.row() for s in group]
            result = engine.step(Step(decode=tuple(rows)))
            for stream, outcome in zip(group, result.decode, strict=True):
                stream.token = outcome.get()
        seconds = time.perf_counter() - started
        mask_seconds = sum(s.sampler.constraint_seconds for s in group)
    finally:
        for stream in group:
            engine.close_session(stream.session, keep=False)
    run = {
        "mode": mode,
        "streams": streams,
        "constrained_rows": constrained,
        "seconds": seconds,
        "tok_s": streams * tokens / seconds,
        "step_ms": seconds / tokens * 1e3,
        "mask_ms_per_constrained_token": mask_seconds / max(constrained * tokens, 1) * 1e3,
        "restarts": sum(s.restarts for s in group),
    }
    if parts is not None:
        run["parts_ms_per_step"] = parts.take(tokens)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    server_arguments(parser, provider="cpu", model="default", precision="int4")
    parser.add_argument("--streams", default="1,8")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES), help="of none, half, all")
    parser.add_argument(
        "--schema",
        default="closed",
        choices=sorted(SCHEMAS),
        help="closed: the 10 properties, additionalProperties false (a DFA); open: the same "
        "read as the spec reads it, others allowed after them (the pushdown engine); "
        'object: {"type": "object"} (json_object; the pushdown engine)',
    )
    parser.add_argument(
        "--time-parts",
        action="store_true",
        help="also report the host ms per step of the backend's parts (run, choose, masks)",
    )
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = Path(resolve_model(args))
    streams = [int(s) for s in args.streams.split(",")]
    engine = Engine.load(
        model, EngineOptions(provider=args.provider, max_sessions=max(streams), capacity=1024)
    )
    engine.warm_up()
    vocab = vocabulary(model, engine)
    report: dict[str, Any] = {
        "machine": machine(),
        "model": str(model),
        "provider": engine.facts.provider,
        "vocab": vocab.size,
        "compile": compile_times(vocab, 5),
        "runs": [],
    }
    print(json.dumps(report["compile"]), flush=True)
    compiled = compile_constraint("json_schema", json.dumps(SCHEMAS[args.schema]), vocab)
    report["schema"], report["engine"] = args.schema, type(compiled).__name__
    started = time.perf_counter()
    warmed = compiled.warm()  # a DFA's: every state's mask; the pushdown engine's: the first 256
    report["compile"]["warm_all_masks"] = {"states": warmed, "ms": (time.perf_counter() - started) * 1e3}
    eos = frozenset(engine.facts.eos_ids)
    parts = Parts(engine) if args.time_parts else None
    for count in streams:
        for mode in args.modes.split(","):  # untimed: first uses (kernel builds, memory pools) are not steps
            run_mode(engine, count, 4, args.prompt, mode, compiled, eos, seed=99, parts=parts)
        if parts is not None:
            parts.take(1)
        for repeat in range(args.repeats):
            for mode in args.modes.split(","):
                run = run_mode(
                    engine, count, args.tokens, args.prompt, mode, compiled, eos, seed=repeat, parts=parts
                )
                run["repeat"] = repeat
                report["runs"].append(run)
                print(json.dumps(run), flush=True)
    summary = []
    for count in streams if args.modes == ",".join(MODES) else ():
        tok_s = {
            m: statistics.median(
                r["tok_s"] for r in report["runs"] if r["streams"] == count and r["mode"] == m
            )
            for m in MODES
        }
        masks = [
            r["mask_ms_per_constrained_token"]
            for r in report["runs"]
            if r["streams"] == count and r["mode"] != "none"
        ]
        summary.append(
            {
                "streams": count,
                **{f"tok_s_{m}": round(v, 1) for m, v in tok_s.items()},
                "half_vs_none": round(tok_s["half"] / tok_s["none"], 3),
                "all_vs_none": round(tok_s["all"] / tok_s["none"], 3),
                "mask_ms_per_constrained_token": round(statistics.median(masks), 4),
            }
        )
    report["summary"] = summary
    (out / "structured.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
