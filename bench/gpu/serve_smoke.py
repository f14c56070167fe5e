"""The service on CUDA, end to end: `python -m service --provider cuda` and the real Python client.

Serves the random fp16 8x1024 decoder of the GPU benchmark (vocab 32000, chunk 512,
capacity 8192) and checks, through gRPC: the model info names CUDA; greedy Generate
equals the engine's own CUDA greedy tokens run in this process; Prefill then Decode
equals Generate; four concurrent streams equal the same requests one by one; the
variant cache holds only ladder widths and decode. Writes serve-smoke.json under --out.

    python3 -m bench.gpu.serve_smoke --out $OUT
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from bench.gpu.run import SPECS
from bench.served import free_port
from clients.python import LadderClient, Stopping
from engine.executor import DecodeRow, EngineOptions
from engine.executor.engine import Engine
from engine.modelgen.synthetic import build_synthetic
from engine.sampling import Sampler, SamplingParams

NEW = 24


def engine_greedy(path: Path, prompt: list[int], provider: str) -> list[int]:
    engine = Engine.load(path, EngineOptions(provider=provider, max_sessions=1))
    session = engine.open_session()
    sampler = Sampler(SamplingParams())
    engine.append(session, prompt)
    tokens = [engine.choose(session, sampler)]
    while len(tokens) < NEW:
        tokens.append(engine.decode([DecodeRow(session, tokens[-1], sampler)])[0])
    return tokens


def checks(client: LadderClient, path: Path, prompts: list[list[int]], provider: str) -> dict[str, Any]:
    stop = Stopping(max_new_tokens=NEW, ignore_eos=True)
    info = client.model_info()
    started = time.perf_counter()
    alone = [list(client.generate(p, stopping=stop).token_ids) for p in prompts]
    serial_s = time.perf_counter() - started
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda p: list(client.generate(p, stopping=stop).token_ids), prompts))
    forwards, done = client.prefill([prompts[0][:700], prompts[0][700:]])
    decoded = [
        e.token.id
        for e in client.decode(done.session_id, NEW - 1, stopping=Stopping(ignore_eos=True))
        if e.HasField("token")
    ]
    client.close_session(done.session_id)
    stats = client.engine_stats()
    return {
        "execution_provider": info.execution_provider,
        "ladder": list(info.ladder),
        "generate_equals_engine_greedy": alone[0] == engine_greedy(path, prompts[0], provider),
        "concurrent_equals_one_by_one": together == alone,
        # next_token previews the first token Decode then emits (Decode samples it itself).
        "prefill_then_decode_equals_generate": done.next_token == alone[0][0]
        and decoded == alone[0][: NEW - 1],
        "prefill_widths": [f.width for f in forwards],
        "variant_widths_held": sorted(e.width for e in stats.variants.held),
        "variant_bytes": {str(e.width): e.bytes for e in stats.variants.held},
        "memory": {
            "weights": stats.memory.weights_bytes,
            "kv": stats.memory.kv_bytes,
            "variants": stats.memory.variant_bytes,
        },
        "serial_generate_s": serial_s,
        "prompts": [len(p) for p in prompts],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--provider", default="cuda", help="cpu: a dry run of this script on an fp32 model")
    args = parser.parse_args()
    spec = SPECS["8x1024"] if args.provider == "cuda" else replace(SPECS["8x1024"], dtype="float32")
    path = build_synthetic(spec, Path("/tmp/ladder-gpu-models"), seed=0, chunk_size=512, context_length=8192)
    rng = np.random.default_rng(5)
    prompts = [[int(t) for t in rng.integers(0, 32000, n)] for n in (1137, 300, 41, 900)]
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "service",
            "--model",
            str(path),
            "--provider",
            args.provider,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--metrics-port",
            "0",
            "--max-sessions",
            "6",
        ]
    )
    try:
        with LadderClient(f"127.0.0.1:{port}") as client:
            status = client.wait_until_serving(300)
            result = {"health": status, **checks(client, path, prompts, args.provider)}
    finally:
        server.terminate()
        result_code = server.wait(60)
    result["server_exit_code"] = result_code
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "serve-smoke.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
