"""What every benchmark through the real service needs: a free port, prompts and requests, a stub,
waiting for SERVING, the server's stats and memory, the machine it ran on, the model it serves."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from proto.ladder.v1 import ladder_pb2 as pb
from proto.ladder.v1 import ladder_pb2_grpc

VOCAB_FLOOR = 3


def start_server(
    args: argparse.Namespace,
    model: str,
    port: int,
    *flags: str,
    log: str = "server.log",
    root: Path | None = None,
    python: tuple[str, ...] = (),
) -> subprocess.Popen[bytes]:
    """`python -m service` serving `model` on 127.0.0.1:`port` with the bench's provider and precision,
    no metrics or HTTP port, warnings only, then `flags` (which may open one); its output appended to
    `args.out / log`. From `root` when given (another version of Ladder, side by side: run from
    there, its packages come first)."""
    # No HTTP port unless `flags` ask for one: two bench servers on one host would both take 8000.
    # (A baseline from `root` may predate the HTTP API and its flag.)
    http_off = () if root is not None else ("--http-port", "0")
    cmd = [
        sys.executable,
        *python,
        "-m",
        "service",
        "--model",
        model,
        "--provider",
        args.provider,
        "--model-precision",
        args.precision,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--metrics-port",
        "0",
        *http_off,
        "--log-level",
        "warning",
        *flags,
    ]
    out = open(Path(args.out) / log, "ab")  # noqa: SIM115 — the server process owns it
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=root)


def vocab_of(model: str | Path) -> int:
    """The vocabulary size of a model directory, from its genai_config.json."""
    return int(json.loads((Path(model) / "genai_config.json").read_text())["model"]["vocab_size"])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prompt(n: int, seed: int, vocab: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(VOCAB_FLOOR, min(vocab, 32000), n)]


def request(tokens: list[int], new: int) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        prompt=pb.Prompt(tokens=pb.TokenIds(ids=tokens)),
        stopping=pb.StoppingOptions(max_new_tokens=new, ignore_eos=True),
    )


def stub(address: str) -> Any:
    return ladder_pb2_grpc.LadderStub(grpc.insecure_channel(address))


def wait_serving(address: str, seconds: float = 600) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    health = health_pb2_grpc.HealthStub(grpc.insecure_channel(address))
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if health.Check(health_pb2.HealthCheckRequest()).status == health_pb2.HealthCheckResponse.SERVING:
                return
        except grpc.RpcError:
            pass
        time.sleep(0.5)
    raise TimeoutError("the server never became SERVING")


def engine_stats(address: str) -> dict[str, Any]:
    s = stub(address).GetEngineStats(pb.GetEngineStatsRequest())
    return {
        "prepared": s.variants.prepared,
        "entries": [(e.width, e.batch) for e in s.variants.held],
        "evictions": s.variants.evictions,
        "refusals": s.variants.refusals,
        "eager_forwards": s.eager_forwards,
        "decode_steps": s.decode.steps,
        "decode_rows": s.decode.rows,
        "batch_use": {str(w.batch): w.forwards for w in s.decode.widths},
        "memory": {
            "weights": s.memory.weights_bytes,
            "kv": s.memory.kv_bytes,
            "variants": s.memory.variant_bytes,
        },
    }


def device_used() -> int | None:
    try:
        import cupy as cp

        free, total = cp.cuda.runtime.memGetInfo()
        return int(total - free)
    except Exception:  # noqa: BLE001 — no device here: the CPU run reports RSS instead
        return None


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def machine() -> dict[str, Any]:
    info = {
        "date": dt.date.today().isoformat(),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    try:
        info["gpu"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        info["gpu"] = None
    return info


def resolve_model(args: argparse.Namespace) -> str:
    if args.model.startswith("gpu:"):
        from bench.gpu.run import build

        return str(build(args.model[4:], Path("/tmp/ladder-gpu-models")))
    if args.model == "default":
        from engine.default_model import prepare

        return str(prepare(Path(args.cache), precision=args.precision).model_dir)
    return args.model


def server_arguments(parser: argparse.ArgumentParser, provider: str, model: str, precision: str) -> None:
    """The flags every benchmark of a served model takes: where results go, and what it serves (the
    default model's cache defaults to the server's own)."""
    from service.config import load_config

    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--provider", default=provider)
    parser.add_argument("--model", default=model, help='"default", "gpu:<spec>", or a model directory')
    parser.add_argument("--precision", default=precision)
    parser.add_argument("--cache", default=load_config(argv=[]).model_cache)
