"""Continuous batching through the real service: N concurrent streams, one process per client group.

Starts `python -m service` on a free port and drives it over gRPC as users do:
- aggregate generated tok/s for N concurrent Generate calls (each its own prompt,
  greedy, ignore_eos), end to end and in the steady window where every call
  decodes; the ratio to one call; the same with GenerateStream (one gRPC message
  per token: Python gRPC's own cost per message shows there);
- every stream's tokens against the same request run alone;
- TTFT of a long prompt arriving while 16 streams decode, against an idle server;
- the running streams' inter-token p99 while a very long prompt prefills, against idle;
- a soak of random prompt lengths and arrival times: new variants after warm-up,
  device memory (CUDA) or server RSS (CPU) sampled as it runs;
- on CUDA, onnxruntime's raw batched graph replay of the same graph (the ceiling).

    python -m bench.batching --provider cuda --model gpu:16x2048 --out $OUT
    python -m bench.batching --provider cpu --model default --precision int4 --streams 1,2,4 \
        --prompt 128 --new 64 --out bench/results/...
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import served
from bench.served import (
    device_used,
    engine_stats,
    free_port,
    machine,
    prompt,
    request,
    resolve_model,
    rss,
    server_arguments,
    stub,
    vocab_of,
    wait_serving,
)


# -- clients: each stream records wall-clock times of its tokens (time.time: shared across processes) --
def run_stream(address: str, tokens: list[int], new: int) -> dict[str, Any]:
    start = time.time()
    ids, times = [], []
    for event in stub(address).GenerateStream(request(tokens, new)):
        if event.HasField("token"):
            ids.append(event.token.id)
            times.append(time.time())
    return {"start": start, "ids": ids, "times": times}


def run_unary(address: str, tokens: list[int], new: int) -> dict[str, Any]:
    """One Generate call; token times from the completion's timing (TTFT, then each inter-token gap)."""
    start = time.time()
    reply = stub(address).Generate(request(tokens, new))
    times = [start + reply.timing.ttft_ms / 1e3]
    for gap in reply.timing.inter_token_ms:
        times.append(times[-1] + gap / 1e3)
    return {"start": start, "ids": list(reply.token_ids), "times": times, "end": time.time()}


def _group(args: tuple[str, list[list[int]], int, bool]) -> list[dict[str, Any]]:
    from concurrent.futures import ThreadPoolExecutor

    address, prompts, new, streaming = args
    call = run_stream if streaming else run_unary
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda p: call(address, p, new), prompts))


def concurrent(
    address: str, prompts: list[list[int]], new: int, processes: int, streaming: bool = False
) -> list[dict[str, Any]]:
    """All prompts at once (Generate, or GenerateStream), spread over client processes so the
    client's GIL is not the bottleneck."""
    groups = [prompts[i::processes] for i in range(min(processes, len(prompts)))]
    with mp.get_context("spawn").Pool(len(groups)) as pool:
        parts = pool.map(_group, [(address, g, new, streaming) for g in groups])
    out: list[dict[str, Any]] = [{}] * len(prompts)
    for i, part in enumerate(parts):
        for j, stream in enumerate(part):
            out[i + j * len(groups)] = stream
    return out


def throughput(streams: list[dict[str, Any]]) -> dict[str, Any]:
    starts = [s["start"] for s in streams]
    firsts = [s["times"][0] for s in streams]
    lasts = [s["times"][-1] for s in streams]
    ends = [s.get("end", s["times"][-1]) for s in streams]
    total = sum(len(s["ids"]) for s in streams)
    # Steady window: every stream has its first token and none has finished.
    lo, hi = max(firsts), min(lasts)
    inside = sum(1 for s in streams for t in s["times"] if lo <= t <= hi)
    gaps = [b - a for s in streams for a, b in zip(s["times"], s["times"][1:], strict=False)]
    return {
        "streams": len(streams),
        "tokens": total,
        "end_to_end_tok_s": total / (max(ends) - min(starts)),
        "steady_tok_s": inside / (hi - lo) if hi - lo > 0.05 else None,
        "steady_window_s": hi - lo,
        "ttft_ms_median": 1e3 * float(np.median([f - s for f, s in zip(firsts, starts, strict=True)])),
        "inter_token_ms_p50": 1e3 * float(np.percentile(gaps, 50)) if gaps else None,
        "inter_token_ms_p99": 1e3 * float(np.percentile(gaps, 99)) if gaps else None,
    }


# -- the service ----------------------------------------------------------------------------
def start_server(
    args: argparse.Namespace, model: str, port: int, root: Path | None = None
) -> subprocess.Popen[bytes]:
    """`python -m service` from this checkout, or from `root` (another version of Ladder, side by side)."""
    return served.start_server(
        args,
        model,
        port,
        "--max-sessions",
        str(max(args.streams) + 2),
        "--max-queue",
        "1024",
        "--capacity",
        str(args.capacity),
        "--max-new-tokens",
        str(args.capacity),
        *(args.server_args.split() if root is None else []),
        root=root,
    )


def scaling(
    address: str,
    args: argparse.Namespace,
    vocab: int,
    counts: list[int] | None = None,
    streaming: bool = False,
) -> dict[str, Any]:
    """N calls at once for each N; the single call is measured three times (its median row kept)."""
    out: dict[str, Any] = {}
    prompts = [prompt(args.prompt, seed, vocab) for seed in range(max(args.streams))]
    concurrent(address, prompts[:2], 4, 2)  # warm-up: the client processes, the server's first calls
    for n in sorted(set([1, *(counts or args.streams)])):
        runs = []
        for _ in range(3 if n == 1 else 1):
            streams = concurrent(address, prompts[:n], args.new, min(n, args.client_processes), streaming)
            runs.append({**throughput(streams), "tokens_by_stream": [s["ids"] for s in streams]})
        runs.sort(key=lambda row: row["end_to_end_tok_s"])
        out[str(n)] = runs[len(runs) // 2]
    one = out["1"]
    for row in out.values():
        for key in ("end_to_end_tok_s", "steady_tok_s"):
            if row[key] and one[key]:
                row[key.replace("tok_s", "x_one_stream")] = row[key] / one[key]
    return out


def agreement(alone: list[list[int]], batched: list[list[int]]) -> dict[str, Any]:
    """Per stream (of those run both ways): equal or not, and how many leading tokens agree."""
    pairs = list(zip(alone, batched, strict=False))
    prefix = [
        next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a)) for a, b in pairs
    ]
    return {"compared": len(pairs), "equal": sum(a == b for a, b in pairs), "common_prefix": prefix}


def alone(address: str, prompts: list[list[int]], new: int) -> list[list[int]]:
    return [run_stream(address, p, new)["ids"] for p in prompts]


def long_prompt_under_load(address: str, args: argparse.Namespace, vocab: int) -> dict[str, Any]:
    """TTFT of a long prompt idle vs while 16 streams decode; the streams' gaps while it prefills."""
    from concurrent.futures import ThreadPoolExecutor

    streams_n = min(16, max(args.streams))
    long = prompt(args.long_prompt, 999, vocab)
    idle = [run_stream(address, long, 1) for _ in range(3)]
    idle_ttft = float(np.median([s["times"][0] - s["start"] for s in idle]))
    very_long = prompt(args.very_long_prompt, 998, vocab)
    run_stream(address, very_long, 1)  # its widths are warm
    background = [prompt(args.prompt, 500 + i, vocab) for i in range(streams_n)]
    new = min(args.capacity - args.prompt - 1, 100000)
    with ThreadPoolExecutor(streams_n + 2) as pool:
        running = [pool.submit(run_stream, address, p, new) for p in background]
        time.sleep(args.settle_s)
        loaded = pool.submit(run_stream, address, long, 1).result()
        time.sleep(args.settle_s / 2)
        marker = time.time()
        prefilled = pool.submit(run_stream, address, very_long, 1).result()
        results = [f.result() for f in running]
    window = (prefilled["start"], prefilled["times"][0])
    during, before = [], []
    for s in results:
        for a, b in zip(s["times"], s["times"][1:], strict=False):
            if window[0] <= b and a <= window[1]:
                during.append(b - a)
            elif marker - 2 * args.settle_s / 4 <= a and b < window[0]:
                before.append(b - a)
    loaded_ttft = loaded["times"][0] - loaded["start"]

    def p99(gaps: list[float]) -> float:
        return float(np.percentile(gaps, 99))

    return {
        "long_prompt": args.long_prompt,
        "ttft_idle_ms": 1e3 * idle_ttft,
        "ttft_under_16_streams_ms": 1e3 * loaded_ttft,
        "ttft_ratio": loaded_ttft / idle_ttft,
        "very_long_prompt": args.very_long_prompt,
        "very_long_prefill_ms": 1e3 * (window[1] - window[0]),
        "inter_token_p99_idle_ms": 1e3 * p99(before) if before else None,
        "inter_token_p99_during_prefill_ms": 1e3 * p99(during) if during else None,
        "inter_token_p99_ratio": p99(during) / p99(before) if before and during else None,
        "gaps_idle": len(before),
        "gaps_during": len(during),
    }


def soak(address: str, args: argparse.Namespace, vocab: int, pid: int) -> dict[str, Any]:
    """Random prompt lengths, output lengths and arrival times; variants and memory as it runs."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(11)
    before = engine_stats(address)
    memory: list[int] = []
    with ThreadPoolExecutor(64) as pool:
        futures = []
        for i in range(args.soak):
            n = int(rng.integers(2, args.capacity // 2))
            new = int(rng.integers(1, 48))
            futures.append(pool.submit(run_stream, address, prompt(n, 10_000 + i, vocab), new))
            time.sleep(float(rng.exponential(args.soak_gap_s)))
            if i % 50 == 49:
                memory.append(device_used() if args.provider == "cuda" else rss(pid))
        done = [f.result() for f in futures]
    after = engine_stats(address)
    return {
        "requests": len(done),
        "new_variants": after["prepared"] - before["prepared"],
        "new_evictions": after["evictions"] - before["evictions"],
        "new_eager_forwards": after["eager_forwards"] - before["eager_forwards"],
        "memory_every_50": memory,
        "memory_spread": max(memory) - min(memory) if memory else None,
        "memory_kind": "device bytes used" if args.provider == "cuda" else "server RSS bytes",
        "stats_after": after,
    }


def decode_buffers(cp: Any, info: Any, rows: int, capacity: int, past: int) -> dict[str, Any]:
    """A B-row decode step's device buffers: its KV blocks (past and present share them), masks of a
    different length in every row, one token id a row, and its logits."""
    mask = cp.zeros((rows, capacity), cp.int64)
    for row in range(rows):
        mask[row, : past + row % 7 + 1] = 1
    return {
        "kv": [
            cp.zeros((rows, info.num_kv_heads, capacity, info.head_size), cp.float16)
            for _ in range(2 * info.num_layers)
        ],
        "mask": mask,
        "ids": cp.full((rows, 1), 5, cp.int64),
        "logits": cp.zeros((rows, 1, info.vocab_size), cp.float16),
    }


def bind_decode_step(session: Any, info: Any, buffers: dict[str, Any]) -> Any:
    """An IOBinding of `decode_buffers` (each KV block bound as its layer's past and present)."""
    binding = session.io_binding()

    def bind(fn: Any, name: str, array: Any) -> None:
        fn(name, "cuda", 0, array.dtype, list(array.shape), array.data.ptr)

    bind(binding.bind_input, info.feed.name, buffers["ids"])
    bind(binding.bind_input, info.mask, buffers["mask"])
    bind(binding.bind_output, "logits", buffers["logits"])
    layers = zip(info.kv_inputs, info.kv_outputs, strict=True)
    names = [n for pair in layers for n in zip(*pair, strict=True)]
    for (name_in, name_out), array in zip(names, buffers["kv"], strict=True):
        bind(binding.bind_input, name_in, array)
        bind(binding.bind_output, name_out, array)
    return binding


def raw_replay(model_dir: Path, batches: list[int], capacity: int, past: int) -> dict[str, Any]:
    """onnxruntime alone: one decode step of B rows as a captured CUDA graph, KV shared past/present."""
    import cupy as cp
    import onnxruntime as ort

    from engine.model import load_model_info

    info = load_model_info(model_dir)
    session = ort.InferenceSession(
        str(info.graph), providers=[("CUDAExecutionProvider", {"enable_cuda_graph": "1"})]
    )
    out = {}
    for graph_id, b in enumerate(batches, start=1):
        buffers = decode_buffers(cp, info, b, capacity, past)  # held while bound: the binding keeps addresses
        binding = bind_decode_step(session, info, buffers)
        options = ort.RunOptions()
        options.add_run_config_entry("gpu_graph_id", str(graph_id))
        for _ in range(5):
            session.run_with_iobinding(binding, options)
        steps = 200
        start = time.perf_counter()
        for _ in range(steps):
            session.run_with_iobinding(binding, options)
        cp.cuda.Device().synchronize()
        ms = (time.perf_counter() - start) * 1e3 / steps
        out[str(b)] = {"step_ms": ms, "tok_s": b * 1e3 / ms}
    return out


def floors(name: str, batches: list[int], past: int) -> dict[str, Any]:
    """The decode step's memory-bandwidth floor at each batch, at the H200's stated bandwidth and at
    the copy bandwidth measured on this device (bench/gpu/run.py)."""
    from bench.gpu.run import H200_BANDWIDTH, copy_bandwidth, decode_floors, spec_of

    spec = spec_of(name)
    return {
        "stated": decode_floors(spec, batches, past, H200_BANDWIDTH),
        "measured_copy": decode_floors(spec, batches, past, copy_bandwidth()),
    }


def baseline(args: argparse.Namespace, model: str, vocab: int) -> dict[str, Any]:
    """The same scaling run against another version of the service (e.g. the last release)."""
    port = free_port()
    server = start_server(args, model, port, args.baseline_root)
    try:
        wait_serving(f"127.0.0.1:{port}")
        address = f"127.0.0.1:{port}"
        rows = scaling(address, args, vocab, [n for n in (1, 16) if n <= max(args.streams)])
        streaming = scaling(address, args, vocab, [1], True)
    finally:
        server.terminate()
        server.wait(120)
    for row in (*rows.values(), *streaming.values()):
        row.pop("tokens_by_stream", None)
    return {"root": str(args.baseline_root), "scaling": rows, "scaling_streaming": streaming}


def engine_single_stream(model_dir: Path, args: argparse.Namespace, vocab: int) -> dict[str, Any]:
    """The engine alone (no gRPC, no scheduler): one session's greedy decode rate, lookahead on and off."""
    from engine.executor import DecodeRow, EngineOptions
    from engine.executor.engine import Engine
    from engine.sampling import Sampler, SamplingParams

    out: dict[str, float] = {}
    for lookahead in (True, False):  # one load each (an 8B-class model loads for tens of seconds)
        engine = Engine.load(
            model_dir,
            EngineOptions(
                provider=args.provider, capacity=args.capacity, max_sessions=1, lookahead=lookahead
            ),
        )
        engine.warm_up()
        greedy = Sampler(SamplingParams())
        for _ in range(2):  # twice, the best kept
            session = engine.open_session()
            engine.append(session, prompt(args.prompt, 0, vocab))
            token = engine.choose(session, greedy)
            start = time.perf_counter()
            for _ in range(args.new - 1):
                token = engine.decode([DecodeRow(session, token, greedy)])[0]  # type: ignore[assignment]
            name = "lookahead" if lookahead else "stepwise"
            out[name] = max(out.get(name, 0.0), (args.new - 1) / (time.perf_counter() - start))
            engine.close_session(session, keep=False)
        engine.close()
    return {"decode_tok_s": out}


def numerics(model_dir: Path, args: argparse.Namespace, vocab: int, streams: int = 16) -> dict[str, Any]:
    """Where a batched stream's greedy tokens leave its tokens alone, how close the race was there.

    The engine alone: each prompt on a one-slot engine (batch 1), then all of them decoding
    together on a `streams`-slot engine (lookahead as configured). At each stream's first
    differing token: the gap between the two best logits of the run alone (a near tie flips
    under a different kernel's rounding), and the largest logits difference at the first decode.
    """
    from engine.executor import DecodeRow, EngineOptions
    from engine.executor.engine import Engine
    from engine.sampling import Sampler, SamplingParams

    greedy = Sampler(SamplingParams())
    prompts = [prompt(args.prompt, seed, vocab) for seed in range(streams)]

    def run(engine: Any, group: list[list[int]]) -> tuple[list[list[int]], list[list[Any]]]:
        sessions = [engine.open_session() for _ in group]
        for session, tokens in zip(sessions, group, strict=True):
            engine.append(session, tokens)
        outs = [[engine.choose(s, greedy)] for s in sessions]
        logits: list[list[Any]] = [[] for _ in group]
        for _ in range(args.new - 1):
            chosen = engine.decode([DecodeRow(s, o[-1], greedy) for s, o in zip(sessions, outs, strict=True)])
            for i, (s, token) in enumerate(zip(sessions, chosen, strict=True)):
                outs[i].append(token)
                logits[i].append(engine.logits(s).astype(np.float32))
        for s in sessions:
            engine.close_session(s)
        return outs, logits

    options = EngineOptions(provider=args.provider, capacity=args.capacity, max_sessions=1)
    single = Engine.load(model_dir, options)
    alone = [run(single, [p]) for p in prompts]
    single.close()
    batched_engine = Engine.load(
        model_dir, EngineOptions(provider=args.provider, capacity=args.capacity, max_sessions=streams)
    )
    together, together_logits = run(batched_engine, prompts)
    rows = []
    for (tokens, logits), mine, mine_logits in zip(alone, together, together_logits, strict=True):
        first = next((i for i, (a, b) in enumerate(zip(tokens[0], mine, strict=True)) if a != b), None)
        top2 = None
        if first is not None and first > 0:
            row = np.sort(logits[0][first - 1])
            top2 = float(row[-1] - row[-2])
        rows.append(
            {
                "first_difference": first,
                "alone_top2_gap_there": top2,
                "first_decode_max_logit_diff": float(np.abs(logits[0][0] - mine_logits[0]).max()),
            }
        )
    return {"streams": streams, "equal": sum(r["first_difference"] is None for r in rows), "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser()
    server_arguments(parser, provider="cuda", model="gpu:16x2048", precision="fp32")
    parser.add_argument("--streams", default="1,2,4,8,16,32,64")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--capacity", type=int, default=4608)
    parser.add_argument("--long-prompt", type=int, default=1000)
    parser.add_argument("--very-long-prompt", type=int, default=4000)
    parser.add_argument("--settle-s", type=float, default=1.0)
    parser.add_argument("--soak", type=int, default=500)
    parser.add_argument("--soak-gap-s", type=float, default=0.01)
    parser.add_argument("--client-processes", type=int, default=8)
    parser.add_argument(
        "--skip", default="", help="comma-separated parts to skip: scaling,load,soak,engine,numerics,raw"
    )
    parser.add_argument("--server-args", default="", help="more flags for this checkout's server")
    parser.add_argument(
        "--baseline-root",
        type=Path,
        default=None,
        help="another checkout of Ladder: its service is measured at 1 and 16 streams first",
    )
    args = parser.parse_args()
    args.streams = [int(n) for n in args.streams.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    skip = set(args.skip.split(","))
    model = resolve_model(args)
    vocab = vocab_of(model)
    result: dict[str, Any] = {
        "machine": machine(),
        "command": " ".join(sys.argv),
        "model": model,
        "settings": {k: str(v) for k, v in vars(args).items()},
    }
    if args.baseline_root is not None:
        result["baseline"] = baseline(args, model, vocab)
    port = free_port()
    address = f"127.0.0.1:{port}"
    server = start_server(args, model, port)
    try:
        wait_serving(address)
        if "scaling" not in skip:
            result["scaling"] = scaling(address, args, vocab)
            counts = sorted({n for n in (1, 16, max(args.streams)) if n <= max(args.streams)})
            result["scaling_streaming"] = scaling(address, args, vocab, counts, True)
            firsts = [prompt(args.prompt, seed, vocab) for seed in range(min(16, max(args.streams)))]
            by_alone = alone(address, firsts, args.new)
            result["batched_vs_alone"] = {
                n: agreement(by_alone, result["scaling"][n]["tokens_by_stream"])
                for n in result["scaling"]
                if int(n) > 1
            }
        if "load" not in skip:
            result["under_load"] = long_prompt_under_load(address, args, vocab)
        if "soak" not in skip:
            result["soak"] = soak(address, args, vocab, server.pid)
        result["engine_stats"] = engine_stats(address)
    finally:
        server.terminate()
        result["server_exit_code"] = server.wait(120)
    if "engine" not in skip:
        result["engine_single_stream"] = engine_single_stream(Path(model), args, vocab)
    if "numerics" not in skip:
        result["numerics"] = numerics(Path(model), args, vocab, min(16, max(args.streams)))
    if args.provider == "cuda" and "raw" not in skip:
        result["raw_replay"] = raw_replay(
            Path(model), sorted(set([1, *args.streams])), args.capacity, args.prompt
        )
    if args.provider == "cuda" and args.model.startswith("gpu:"):
        result["floors"] = floors(args.model[4:], sorted(set([1, *args.streams])), args.prompt)
    for part in ("scaling", "scaling_streaming"):
        for row in result.get(part, {}).values():
            row.pop("tokens_by_stream", None)
    (args.out / "batching.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
