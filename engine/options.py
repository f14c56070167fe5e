"""Engine options: plain values, built by the service's config module (never from the environment here)."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class EngineOptions:
    provider: str = "cpu"  # "cpu" or "cuda"
    padding: bool = True  # the seed's ONNX_GENAI_PREFILL_QUERY_PADDING switch
    chunk_size: int | None = None  # override the model's declared chunk width; 0 = no chunking
    capacity: int | None = None  # KV capacity per session; None = the model's max length
    variant_capacity: int = 0  # 0 = every shape the engine plans: the ladder widths + the decode batch widths
    max_sessions: int = 8  # KV slots
    memory_budget_bytes: int = 0  # weights + KV + variants may not exceed it; 0 = no budget
    intra_op_threads: int = 0  # 0 = onnxruntime's default
    device_id: int = 0
    lookahead: bool = True  # launch the next decode forward before its tokens are read (CUDA)
    # With lookahead: a greedy step's tokens chosen on the device, the next forward queued behind
    # them with no host round trip (CUDA; engine/executor/decode.py's chain).
    decode_chain: bool = True
    # How the host waits for the device (CUDA): "spin" busy-polls, "block" sleeps until the device
    # signals (the context's blocking-sync schedule and blocking events: engine/runtime/cuda_runtime.py),
    # "replay" sleeps through captured forwards' replays alone and spins in the short waits.
    cuda_wait: str = "spin"
    # CUDA: captured forwards (and forwards launched without waiting) run on a thread of their own.
    # onnxruntime's graph replay waits for its forward before it returns, so on the worker's thread
    # the step's host work and its forward take turns; on the runner's they overlap.
    replay_thread: bool = False
    prefix_sharing: bool = True  # a prompt starting with a held prefix (ladder steps) copies it
    # Each row's numerics depend on the request alone: decode forwards at one batch width, prefill
    # forwards a fresh run's own, prefixes shared only where a fresh run's forwards start.
    deterministic: bool = False
    # New prompts' first chunks of one ladder width prefilled together, up to this many in one
    # forward (CUDA: one forward of B prompts costs little more than one; 1 = each alone);
    # 0 = the backend's choice. Never in the deterministic mode: a row's numerics follow the forward.
    prefill_batch: int = 0
    # Drafted decode rows may verify in forwards of their own (speculative decoding, Engine.verify):
    # the variant cache keeps room for the verification widths and the load-time probe measures
    # how far a verification row lies from a decode row. Off: a drafted row decodes plainly.
    speculate: bool = False
    graph_read_only: bool = False  # never rewrite the model's graph: its head then runs on every row
    # Where rewritten graphs are kept (the server: <model_cache>/graphs); None = a temporary
    # directory of this process, removed at exit: a copy can be as large as the model.
    graph_cache: Path | None = None

    @property
    def graph_cache_dir(self) -> Path:
        return self.graph_cache or _process_graph_cache()


@functools.cache
def _process_graph_cache() -> Path:
    path = Path(tempfile.mkdtemp(prefix="ladder-graphs-"))
    atexit.register(shutil.rmtree, path, True)
    return path
