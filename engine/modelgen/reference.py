"""A numpy forward of the decoder arithmetic, for checking the ONNX graph (plain decoders)."""

from __future__ import annotations

import numpy as np

from engine.modelgen.builder import DecoderSpec, DecoderWeights, rotary_caches


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool) -> np.ndarray:
    """Rotary embedding on [heads, rows, head_size] with cos/sin [rows, head_size / 2]."""
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
        return out
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def reference_logits(spec: DecoderSpec, w: DecoderWeights, tokens: list[int]) -> np.ndarray:
    """Logits [rows, vocab] for `tokens` from position 0, computed in float64."""
    n, hd = len(tokens), spec.head_size
    cos, sin = rotary_caches(spec)
    cos, sin = cos[:n], sin[:n]
    x = w.embed[np.asarray(tokens)].astype(np.float64)
    causal = np.triu(np.full((n, n), -np.inf), k=1)
    group = spec.num_heads // spec.num_kv_heads
    for lw in w.layers:
        h = _rms(x, lw.attn_norm, spec.rms_eps)
        q = (h @ lw.q).reshape(n, spec.num_heads, hd).transpose(1, 0, 2)
        k = (h @ lw.k).reshape(n, spec.num_kv_heads, hd).transpose(1, 0, 2)
        v = (h @ lw.v).reshape(n, spec.num_kv_heads, hd).transpose(1, 0, 2)
        q = _rotate(q, cos, sin, spec.rotary_interleaved)
        k = np.repeat(_rotate(k, cos, sin, spec.rotary_interleaved), group, axis=0)
        v = np.repeat(v, group, axis=0)
        scores = q @ k.transpose(0, 2, 1) * hd**-0.5 + causal
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        x = x + (probs @ v).transpose(1, 0, 2).reshape(n, -1) @ lw.o
        h = _rms(x, lw.mlp_norm, spec.rms_eps)
        g = h @ lw.gate
        x = x + (g / (1 + np.exp(-g)) * (h @ lw.up)) @ lw.down
    x = _rms(x, w.final_norm, spec.rms_eps)
    head = w.lm_head if w.lm_head is not None else w.embed.T
    return x @ head
