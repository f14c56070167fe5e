"""One benchmark worker per process, so each one's device memory is its own.

    python -m bench.gpu.workers ladder MODEL_DIR      first request, steady TTFT, decode, two together, soak
    python -m bench.gpu.workers seed MODEL_DIR on|off the seed's experiment: five lengths, two passes
    python -m bench.gpu.workers genai MODEL_DIR       onnxruntime-genai-cuda with CUDA graphs

Each prints one JSON line (its last line of stdout).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

PROMPT = 1137
NEW = 128
LENGTHS = [int(n) for n in np.linspace(40, 1500, 12)]
FRESH = [n + 17 for n in LENGTHS]  # lengths neither runtime has seen: what a new request meets
SEED_LENGTHS = [1137, 1200, 1333, 900, 1450]
VOCAB_FLOOR = 3  # keep ids clear of bos/eos/pad


def prompt(n: int, vocab: int, seed: int | None = None) -> list[int]:
    return np.random.default_rng(n if seed is None else seed).integers(VOCAB_FLOOR, vocab, n).tolist()


def device_used() -> int:
    import cupy as cp

    free, total = cp.cuda.runtime.memGetInfo()
    return int(total - free)


# -- Ladder ---------------------------------------------------------------------------
def ladder_engine(path: str, padding: bool = True) -> Any:
    from engine.executor import EngineOptions
    from engine.executor.engine import Engine

    return Engine.load(path, EngineOptions(provider="cuda", capacity=8192, padding=padding))


def ladder_generate(engine: Any, tokens: list[int], new: int) -> dict[str, Any]:
    from engine.executor import DecodeRow
    from engine.sampling import Sampler, SamplingParams

    greedy = Sampler(SamplingParams())
    session = engine.open_session()
    t0 = time.perf_counter()
    for _ in engine.prefill(session, tokens):
        pass
    out = [engine.choose(session, greedy)]
    t1 = time.perf_counter()
    for _ in range(new - 1):
        out.append(engine.decode([DecodeRow(session, out[-1], greedy)])[0])
    t2 = time.perf_counter()
    engine.close_session(session)
    return {
        "ttft_ms": (t1 - t0) * 1e3,
        "decode_tok_s": (new - 1) / (t2 - t1) if new > 1 else None,
        "tokens": out,
    }


def ladder_ttft_pass(engine: Any, vocab: int, lengths: list[int] = LENGTHS) -> dict[str, Any]:
    before = engine.backend.captures
    times = {n: ladder_generate(engine, prompt(n, vocab), 1)["ttft_ms"] for n in lengths}
    return {
        "ttft_ms": times,
        "median_ms": float(np.median(list(times.values()))),
        "captures": engine.backend.captures - before,
    }


def ladder_interleaved(engine: Any, vocab: int, steps: int = 64) -> dict[str, Any]:
    """Two sessions decoded together: one forward per step for both."""
    from engine.executor import DecodeRow
    from engine.sampling import Sampler, SamplingParams

    greedy = Sampler(SamplingParams())
    sessions = [engine.open_session() for _ in range(2)]
    for seed, s in enumerate(sessions):
        engine.append(s, prompt(PROMPT, vocab, seed))
    outs = [[engine.choose(s, greedy)] for s in sessions]
    t0 = time.perf_counter()
    for _ in range(steps):
        chosen = engine.decode([DecodeRow(s, o[-1], greedy) for s, o in zip(sessions, outs, strict=True)])
        for out, token in zip(outs, chosen, strict=True):
            out.append(token)
    elapsed = time.perf_counter() - t0
    for s in sessions:
        engine.close_session(s)
    return {"sessions": 2, "tok_s_total": 2 * steps / elapsed}


def ladder_profile(engine: Any, vocab: int) -> dict[str, Any]:
    """Decode steps with the time inside onnxruntime's run summed: device time vs wall time per step."""
    from engine.executor import DecodeRow
    from engine.sampling import Sampler, SamplingParams

    greedy, backend = Sampler(SamplingParams()), engine.backend
    session = engine.open_session()
    engine.append(session, prompt(PROMPT, vocab))
    token = engine.choose(session, greedy)
    backend.profile, backend.run_ms, backend.profiled_forwards = True, 0.0, 0
    t0 = time.perf_counter()
    for _ in range(NEW - 1):
        token = engine.decode([DecodeRow(session, token, greedy)])[0]
    wall_ms = (time.perf_counter() - t0) * 1e3 / (NEW - 1)
    backend.profile = False
    engine.close_session(session)
    run_ms = backend.run_ms / backend.profiled_forwards
    # Inside onnxruntime's run: graph launch, the device's work and the end-of-run sync.
    return {
        "wall_ms_per_step": wall_ms,
        "ort_run_ms_per_step": run_ms,
        "ladder_host_ms_per_step": wall_ms - run_ms,
    }


def ladder_soak(engine: Any, vocab: int, requests: int = 200) -> dict[str, Any]:
    rng = np.random.default_rng(7)
    prepared, eager = engine.variants.prepared, engine.eager_forwards
    memory = []
    for i in range(requests):
        n, new = int(rng.integers(2, 1500)), int(rng.integers(1, 17))
        ladder_generate(engine, prompt(n, vocab, seed=1000 + i), new)
        if i % 20 == 19:
            memory.append(device_used())
    return {
        "requests": requests,
        "new_variants": engine.variants.prepared - prepared,
        "eager_forwards": engine.eager_forwards - eager,
        "device_used_every_20": memory,
        "device_used_spread": max(memory) - min(memory),
    }


def run_ladder(path: str) -> dict[str, Any]:
    base = device_used()
    t0 = time.perf_counter()
    engine = ladder_engine(path)
    vocab = engine.info.vocab_size
    result: dict[str, Any] = {"load_s": time.perf_counter() - t0}
    result["first"] = ladder_generate(engine, prompt(PROMPT, vocab), NEW)
    result["ttft_pass1"] = ladder_ttft_pass(engine, vocab)
    result["ttft_pass2"] = ladder_ttft_pass(engine, vocab)
    result["ttft_fresh"] = ladder_ttft_pass(engine, vocab, FRESH)
    result["steady"] = ladder_generate(engine, prompt(PROMPT, vocab), NEW)
    result["first_tokens_12"] = {n: ladder_generate(engine, prompt(n, vocab), 4)["tokens"] for n in LENGTHS}
    result["profile"] = ladder_profile(engine, vocab)
    result["interleaved"] = ladder_interleaved(engine, vocab)
    result["soak"] = ladder_soak(engine, vocab)
    result["variants"] = [
        {"width": e.key.width, "batch": e.key.batch, "nbytes": e.nbytes, "hits": e.hits}
        for e in engine.stats().variants.entries
    ]
    result["backend_memory"] = engine.backend.memory()
    result["eager_forwards"] = engine.eager_forwards
    result["device_used_after"] = device_used() - base
    return result


def run_seed(path: str, padding: bool) -> dict[str, Any]:
    base = device_used()
    engine = ladder_engine(path, padding)
    vocab = engine.info.vocab_size
    passes = []
    for _ in range(2):
        prepared, eager, captures = engine.variants.prepared, engine.eager_forwards, engine.backend.captures
        t0 = time.perf_counter()
        ttft = [ladder_generate(engine, prompt(n, vocab), 4)["ttft_ms"] for n in SEED_LENGTHS]
        passes.append(
            {
                "seconds": time.perf_counter() - t0,
                "ttft_ms": ttft,
                "variants_prepared": engine.variants.prepared - prepared,
                "graphs_captured": engine.backend.captures - captures,
                "eager_forwards": engine.eager_forwards - eager,
                "device_used": device_used() - base,
            }
        )
    stats = engine.stats().variants
    return {
        "padding": padding,
        "passes": passes,
        "refusals": stats.refusals,
        "variant_widths": [e.key.width for e in stats.entries],
        "variant_bytes": stats.nbytes,
    }


# -- onnxruntime-genai ------------------------------------------------------------------
def genai_generate(model: Any, tokens: list[int], new: int, max_length: int = 8192) -> dict[str, Any]:
    import onnxruntime_genai as og

    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length, do_sample=False)
    generator = og.Generator(model, params)
    t0 = time.perf_counter()
    generator.append_tokens(tokens)
    generator.generate_next_token()
    out = [int(generator.get_next_tokens()[0])]
    t1 = time.perf_counter()
    while len(out) < new and not generator.is_done():
        generator.generate_next_token()
        out.append(int(generator.get_next_tokens()[0]))
    t2 = time.perf_counter()
    del generator
    return {
        "ttft_ms": (t1 - t0) * 1e3,
        "decode_tok_s": (len(out) - 1) / (t2 - t1) if len(out) > 1 else None,
        "tokens": out,
    }


def run_genai(path: str) -> dict[str, Any]:
    import onnxruntime_genai as og

    base = device_used()
    vocab = json.loads((Path(path) / "genai_config.json").read_text())["model"]["vocab_size"]
    t0 = time.perf_counter()
    model = og.Model(path)
    result: dict[str, Any] = {"load_s": time.perf_counter() - t0, "version": og.__version__}
    result["first"] = genai_generate(model, prompt(PROMPT, vocab), NEW)
    for name, lengths in (("ttft_pass1", LENGTHS), ("ttft_pass2", LENGTHS), ("ttft_fresh", FRESH)):
        times = {n: genai_generate(model, prompt(n, vocab), 1)["ttft_ms"] for n in lengths}
        result[name] = {"ttft_ms": times, "median_ms": float(np.median(list(times.values())))}
    result["steady"] = genai_generate(model, prompt(PROMPT, vocab), NEW)
    result["first_tokens_12"] = {n: genai_generate(model, prompt(n, vocab), 4)["tokens"] for n in LENGTHS}
    result["device_used_after"] = device_used() - base
    return result


def cold_request(path: str, runtime: str) -> dict[str, Any]:
    """One unmeasured-before request in a fresh process: load plus first TTFT, caches as they are.

    In the first GPU run the first process to touch a model paid up to ~1 s more on its
    first request than later ones (one-off kernel compiles and module loads, we believe);
    run.py runs one cold process per runtime, alternating which goes first per model.
    """
    if runtime == "ladder":
        engine = ladder_engine(path)
        return {"ttft_ms": ladder_generate(engine, prompt(PROMPT, engine.info.vocab_size), 4)["ttft_ms"]}
    import onnxruntime_genai as og

    vocab = json.loads((Path(path) / "genai_config.json").read_text())["model"]["vocab_size"]
    return {"ttft_ms": genai_generate(og.Model(path), prompt(PROMPT, vocab), 4)["ttft_ms"]}


def main(argv: list[str]) -> None:
    kind, path = argv[0], argv[1]
    if kind == "cold":
        result = cold_request(path, argv[2])
    elif kind == "ladder":
        result = run_ladder(path)
    elif kind == "seed":
        result = run_seed(path, argv[2] == "on")
    else:
        result = run_genai(path)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
