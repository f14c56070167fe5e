"""Seeded random GQA decoders for tests and benchmarks, built into a cache directory.

Each variant is a model directory in the onnxruntime-genai layout; building
one takes well under a second and nothing binary is kept in git.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from engine.model import GRAPH_FILE
from engine.modelgen.builder import (
    DecoderSpec,
    DecoderWeights,
    LayerWeights,
    build_decoder,
    genai_config,
    write_model_dir,
)

TINY = DecoderSpec(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_size=16,
    rotary_rows=2048,
)

VARIANTS: dict[str, DecoderSpec] = {
    "plain": TINY,
    "embeddings": replace(TINY, embeddings_input=True, per_token_port=8),
    "recurrent": replace(TINY, recurrent_state=3),
    "last_row": replace(TINY, last_row_logits=True),
    "bias_port": replace(TINY, bias_port=True),
}


def random_weights(spec: DecoderSpec, seed: int = 0, repeat_layers: bool = False) -> DecoderWeights:
    """Weights scaled so activations stay O(1) and greedy margins stay wide. With `repeat_layers`
    every layer gets the first layer's arrays (each still stored as its own weights): an 8B-class
    model is drawn in seconds, and bytes and shapes, all a timing reads, are those of distinct ones."""
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int) -> np.ndarray:
        return rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(rows)

    def norm() -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(spec.hidden_size)).astype(np.float32)

    h, kv = spec.hidden_size, spec.num_kv_heads * spec.head_size
    q = spec.num_heads * spec.head_size

    def layer() -> LayerWeights:
        return LayerWeights(
            attn_norm=norm(),
            q=mat(h, q),
            k=mat(h, kv),
            v=mat(h, kv),
            o=mat(q, h),
            mlp_norm=norm(),
            gate=mat(h, spec.intermediate_size),
            up=mat(h, spec.intermediate_size),
            down=mat(spec.intermediate_size, h),
        )

    layers = [layer()] * spec.num_layers if repeat_layers else [layer() for _ in range(spec.num_layers)]
    extras: dict[str, np.ndarray] = {}
    if spec.per_token_port:
        extras["per_token_proj"] = mat(spec.per_token_port, h)
    if spec.recurrent_state:
        extras["conv_kernel"] = 0.5 * rng.standard_normal((h, 1, spec.recurrent_state + 1)).astype(np.float32)
    embed = rng.standard_normal((spec.vocab_size, h), dtype=np.float32)
    return DecoderWeights(
        embed=embed, layers=layers, final_norm=norm(), lm_head=mat(h, spec.vocab_size) * 4.0, extras=extras
    )


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "ladder" / "synthetic"


def build_synthetic(
    spec: DecoderSpec,
    root: Path | None = None,
    *,
    seed: int = 0,
    chunk_size: int = 64,
    context_length: int = 1024,
    repeat_layers: bool = False,
) -> Path:
    """Build (or reuse) the model directory for `spec` and return its path."""
    identity: list[object] = [asdict(spec), seed, chunk_size, context_length]
    key = json.dumps(identity + ["repeat_layers"] if repeat_layers else identity, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    path = (root or default_cache_dir()) / digest
    if (path / "genai_config.json").exists() and (path / GRAPH_FILE).exists():
        return path
    weights = random_weights(spec, seed, repeat_layers)
    model = build_decoder(spec, weights)
    tmp = path.with_name(path.name + ".tmp")
    write_model_dir(tmp, model, genai_config(spec, context_length=context_length, chunk_size=chunk_size))
    tmp.replace(path) if not path.exists() else None
    return path
