"""An ONNX graph builder for Llama-style GQA decoders, laid out as onnxruntime-genai's builder does.

Ports: `input_ids` (or `inputs_embeds`), `attention_mask` turned in-graph into
`seqlens_k` (ReduceSum - 1, int32) and `total_sequence_length` (Shape[1]),
`past_key_values.N.key/value` -> `present.N.key/value`, and `logits` (by default the
head runs only on the query rows `logits_rows` names: engine/head.py).
Attention is com.microsoft GroupQueryAttention with rotary inside (cos/sin
caches as initializers). Weight matrices are stored [in, out] (x @ W).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from engine.head import gather_read_rows
from engine.model import GRAPH_FILE

OPSET = 21
INT64_MAX = np.iinfo(np.int64).max


@dataclass(frozen=True)
class DecoderSpec:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    rotary_rows: int = 4096
    rotary_interleaved: bool = False
    dtype: str = "float32"
    # Variants the tests need (all off for a plain decoder).
    embeddings_input: bool = False
    per_token_port: int = 0  # width k of an extra [1, rows, k] input, 0 = none
    recurrent_state: int = 0  # rows of a fixed-size convolution state, 0 = none
    last_row_logits: bool = False
    bias_port: bool = False  # an extra [hidden] input: not per-token
    # One MatMul for q|k|v (fed to GQA packed) and one for gate|up: fewer, larger kernels.
    packed_projections: bool = False
    # The head runs only on the query rows `logits_rows` names (engine/head.py); False: every row.
    read_rows: bool = True
    # 0: float MatMuls. 32: every layer matrix as com.microsoft MatMulNBits, 4 bits in blocks of 32
    # along the input, symmetric, scales in the model's dtype (as onnxruntime-genai's builder writes
    # int4); the embedding and the head stay float.
    int4_block: int = 0
    # Each residual Add and the norm after it as one com.microsoft SkipSimplifiedLayerNormalization
    # (as onnxruntime-genai's builder writes them): two fewer kernels a layer.
    fused_norms: bool = False

    @property
    def np_dtype(self) -> type[np.floating[Any]]:
        return np.float16 if self.dtype == "float16" else np.float32

    @property
    def onnx_dtype(self) -> int:
        return TensorProto.FLOAT16 if self.dtype == "float16" else TensorProto.FLOAT


@dataclass
class LayerWeights:
    attn_norm: np.ndarray
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    o: np.ndarray
    mlp_norm: np.ndarray
    gate: np.ndarray
    up: np.ndarray
    down: np.ndarray


@dataclass
class DecoderWeights:
    embed: np.ndarray  # [vocab, hidden]
    layers: list[LayerWeights]
    final_norm: np.ndarray
    lm_head: np.ndarray | None = None  # [hidden, vocab]; None = tied to embed
    extras: dict[str, np.ndarray] = field(default_factory=dict)


def rotary_caches(spec: DecoderSpec) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables [rotary_rows, head_size / 2] for positions 0..rotary_rows-1."""
    half = spec.head_size // 2
    inv_freq = 1.0 / (spec.rope_theta ** (np.arange(0, half, dtype=np.float64) * 2 / spec.head_size))
    angles = np.outer(np.arange(spec.rotary_rows, dtype=np.float64), inv_freq)
    return np.cos(angles), np.sin(angles)


class _Graph:
    """Accumulates nodes and initializers with unique names."""

    def __init__(self, spec: DecoderSpec) -> None:
        self.spec = spec
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0
        self._converted: dict[tuple[int, ...], tuple[np.ndarray, ...]] = {}

    def init(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def weight(self, name: str, array: np.ndarray) -> str:
        return self.init(name, array.astype(self.spec.np_dtype))

    def matmul(self, name: str, x: str, *parts: np.ndarray) -> str:
        """x @ the parts side by side ([in, out] each), as a float MatMul or, with `int4_block`, a
        MatMulNBits. Layers that share weight arrays (`random_weights(repeat_layers=True)`) are
        converted once, then stored once per layer."""
        key = tuple(id(p) for p in parts)
        if key not in self._converted:
            w = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
            block = self.spec.int4_block
            self._converted[key] = (
                int4_blocks(w.astype(self.spec.np_dtype), block) if block else (w.astype(self.spec.np_dtype),)
            )
        arrays = self._converted[key]
        if len(arrays) == 1:
            return self.op1("MatMul", [x, self.init(f"{name}.weight", arrays[0])])
        packed, scales = arrays
        k, n = packed.shape[1] * self.spec.int4_block, packed.shape[0]
        inputs = [x, self.init(f"{name}.weight.q4", packed), self.init(f"{name}.weight.scales", scales)]
        return self.op1(
            "MatMulNBits",
            inputs,
            domain="com.microsoft",
            K=k,
            N=n,
            bits=4,
            block_size=self.spec.int4_block,
            accuracy_level=4,
        )

    def op(
        self, op_type: str, inputs: list[str], outputs: int = 1, domain: str = "", **attrs: Any
    ) -> list[str]:
        self._n += 1
        names = [f"{op_type.lower()}_{self._n}_{i}" for i in range(outputs)]
        self.nodes.append(
            helper.make_node(op_type, inputs, names, name=f"{op_type}_{self._n}", domain=domain, **attrs)
        )
        return names

    def op1(self, op_type: str, inputs: list[str], domain: str = "", **attrs: Any) -> str:
        return self.op(op_type, inputs, 1, domain, **attrs)[0]

    def rms_norm(self, x: str, w: str) -> str:
        return self.op1(
            "SimplifiedLayerNormalization", [x, w], axis=-1, epsilon=self.spec.rms_eps, stash_type=1
        )

    def add_norm(self, x: str, delta: str | None, w: str) -> tuple[str, str]:
        """(norm(x + delta), x + delta): the residual stream and the normalized input of what
        follows; `delta` None adds nothing. Fused, one SkipSimplifiedLayerNormalization does both."""
        if delta is None:
            return self.rms_norm(x, w), x
        if not self.spec.fused_norms:
            total = self.op1("Add", [x, delta])
            return self.rms_norm(total, w), total
        self._n += 1
        normed, total = f"skipnorm_{self._n}_0", f"skipnorm_{self._n}_3"
        self.nodes.append(
            helper.make_node(
                "SkipSimplifiedLayerNormalization",
                [x, delta, w],
                [normed, "", "", total],
                name=f"SkipSimplifiedLayerNormalization_{self._n}",
                domain="com.microsoft",
                epsilon=self.spec.rms_eps,
            )
        )
        return normed, total


def _masks(g: _Graph) -> tuple[str, str]:
    """seqlens_k = sum(mask) - 1 (int32), total_sequence_length = mask.shape[1] (int32 scalar)."""
    axes = g.init("axes_1", np.array([1], np.int64))
    one = g.init("one_i64", np.array(1, np.int64))
    total = g.op1("ReduceSum", ["attention_mask", axes], keepdims=0)
    seqlens = g.op1("Cast", [g.op1("Sub", [total, one])], to=TensorProto.INT32)
    shape = g.op1("Shape", ["attention_mask"])
    idx = g.init("idx_1", np.array(1, np.int64))
    total_len = g.op1("Cast", [g.op1("Gather", [shape, idx], axis=0)], to=TensorProto.INT32)
    return seqlens, total_len


def _embed(g: _Graph, w: DecoderWeights, inputs: list[onnx.ValueInfoProto]) -> str:
    spec, dt = g.spec, g.spec.onnx_dtype
    if not spec.embeddings_input or w.lm_head is None:
        g.weight("model.embed_tokens.weight", w.embed)
    if spec.embeddings_input:
        inputs.append(
            helper.make_tensor_value_info(
                "inputs_embeds", dt, ["batch_size", "sequence_length", spec.hidden_size]
            )
        )
        x = "inputs_embeds"
    else:
        inputs.append(
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"])
        )
        x = g.op1("Gather", ["model.embed_tokens.weight", "input_ids"], axis=0)
    if spec.per_token_port:
        inputs.append(
            helper.make_tensor_value_info(
                "per_token_features", dt, ["batch_size", "sequence_length", spec.per_token_port]
            )
        )
        proj = g.weight("per_token_proj", w.extras["per_token_proj"])
        x = g.op1("Add", [x, g.op1("MatMul", ["per_token_features", proj])])
    if spec.bias_port:
        inputs.append(helper.make_tensor_value_info("embedding_bias", dt, [spec.hidden_size]))
        x = g.op1("Add", [x, "embedding_bias"])
    return x


def _recurrent_mix(g: _Graph, x: str, w: DecoderWeights, inputs: list, outputs: list) -> str:
    """A causal depthwise convolution whose last rows are carried as fixed-size state."""
    spec, dt, k = g.spec, g.spec.onnx_dtype, g.spec.recurrent_state
    inputs.append(helper.make_tensor_value_info("past_conv_state.0", dt, ["batch_size", k, spec.hidden_size]))
    outputs.append(
        helper.make_tensor_value_info("present_conv_state.0", dt, ["batch_size", k, spec.hidden_size])
    )
    cat = g.op1("Concat", ["past_conv_state.0", x], axis=1)
    g.nodes.append(
        helper.make_node(
            "Slice",
            [
                cat,
                g.init("conv_start", np.array([-k], np.int64)),
                g.init("conv_end", np.array([INT64_MAX], np.int64)),
                "axes_1",
            ],
            ["present_conv_state.0"],
            name="conv_state_slice",
        )
    )
    kernel = g.weight("conv_kernel", w.extras["conv_kernel"])  # [hidden, 1, k + 1]
    conv = g.op1("Conv", [g.op1("Transpose", [cat], perm=[0, 2, 1]), kernel], group=spec.hidden_size)
    return g.op1("Add", [x, g.op1("Transpose", [conv], perm=[0, 2, 1])])


def _qkv(g: _Graph, p: str, h: str, lw: LayerWeights) -> tuple[str, str, str]:
    """GQA's query, key and value inputs; packed: one q|k|v matrix and empty key and value."""
    if g.spec.packed_projections:
        return g.matmul(f"{p}.attn.qkv_proj", h, lw.q, lw.k, lw.v), "", ""
    return (
        g.matmul(f"{p}.attn.q_proj", h, lw.q),
        g.matmul(f"{p}.attn.k_proj", h, lw.k),
        g.matmul(f"{p}.attn.v_proj", h, lw.v),
    )


def _gate_up(g: _Graph, p: str, h: str, lw: LayerWeights) -> tuple[str, str]:
    if g.spec.packed_projections:
        both = g.matmul(f"{p}.mlp.gate_up_proj", h, lw.gate, lw.up)
        sizes = g.init(f"{p}.mlp.split", np.array([lw.gate.shape[1], lw.up.shape[1]], np.int64))
        gate, up = g.op("Split", [both, sizes], 2, axis=-1)
        return gate, up
    return g.matmul(f"{p}.mlp.gate_proj", h, lw.gate), g.matmul(f"{p}.mlp.up_proj", h, lw.up)


def _layer(
    g: _Graph,
    i: int,
    x: str,
    delta: str | None,
    lw: LayerWeights,
    seqlens: str,
    total: str,
    inputs: list,
    outputs: list,
) -> tuple[str, str]:
    """Layer i on the residual stream x + delta; returns the stream and the layer's own delta (the
    MLP's output), which the next norm adds."""
    spec, dt = g.spec, g.spec.onnx_dtype
    p = f"model.layers.{i}"
    kv_shape = ["batch_size", spec.num_kv_heads, "past_sequence_length", spec.head_size]
    present_shape = ["batch_size", spec.num_kv_heads, "total_sequence_length", spec.head_size]
    for kind in ("key", "value"):
        inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", dt, kv_shape))
        outputs.append(helper.make_tensor_value_info(f"present.{i}.{kind}", dt, present_shape))
    h, x = g.add_norm(x, delta, g.weight(f"{p}.input_layernorm.weight", lw.attn_norm))
    q, k, v = _qkv(g, p, h, lw)
    attn = f"{p}.attn.output"
    g.nodes.append(
        helper.make_node(
            "GroupQueryAttention",
            [
                q,
                k,
                v,
                f"past_key_values.{i}.key",
                f"past_key_values.{i}.value",
                seqlens,
                total,
                "cos_cache",
                "sin_cache",
            ],
            [attn, f"present.{i}.key", f"present.{i}.value"],
            name=f"{p}.GroupQueryAttention",
            domain="com.microsoft",
            num_heads=spec.num_heads,
            kv_num_heads=spec.num_kv_heads,
            do_rotary=1,
            rotary_interleaved=int(spec.rotary_interleaved),
            scale=float(spec.head_size**-0.5),
        )
    )
    h, x = g.add_norm(
        x,
        g.matmul(f"{p}.attn.o_proj", attn, lw.o),
        g.weight(f"{p}.post_attention_layernorm.weight", lw.mlp_norm),
    )
    gate, up = _gate_up(g, p, h, lw)
    act = g.op1("Mul", [g.op1("Mul", [gate, g.op1("Sigmoid", [gate])]), up])
    return x, g.matmul(f"{p}.mlp.down_proj", act, lw.down)


def _lm_head(g: _Graph, x: str, w: DecoderWeights) -> str:
    spec = g.spec
    if spec.last_row_logits:
        # Contract the query axis: only the last row reaches the head.
        x = g.op1(
            "Slice",
            [
                x,
                g.init("last_start", np.array([-1], np.int64)),
                g.init("last_end", np.array([INT64_MAX], np.int64)),
                "axes_1",
            ],
        )
    if w.lm_head is not None:
        return g.op1("MatMul", [x, g.weight("lm_head.weight", w.lm_head)])
    # Tied head: Gemm with transB reads the embedding table in place, no transposed copy.
    flat = g.op1("Reshape", [x, g.init("flat_shape", np.array([-1, spec.hidden_size], np.int64))])
    scores = g.op1("Gemm", [flat, "model.embed_tokens.weight"], transB=1)
    lead = g.op1("Shape", [x], start=0, end=2)
    shape = g.op1("Concat", [lead, g.init("vocab_dim", np.array([spec.vocab_size], np.int64))], axis=0)
    return g.op1("Reshape", [scores, shape])


def build_decoder(spec: DecoderSpec, weights: DecoderWeights) -> onnx.ModelProto:
    """The decoder graph for `spec` carrying `weights`."""
    g = _Graph(spec)
    inputs: list[onnx.ValueInfoProto] = []
    outputs: list[onnx.ValueInfoProto] = []
    x = _embed(g, weights, inputs)
    inputs.append(
        helper.make_tensor_value_info(
            "attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"]
        )
    )
    seqlens, total = _masks(g)
    cos, sin = rotary_caches(spec)
    g.weight("cos_cache", cos)
    g.weight("sin_cache", sin)
    if spec.recurrent_state:
        x = _recurrent_mix(g, x, weights, inputs, outputs)
    delta: str | None = None
    for i, lw in enumerate(weights.layers):
        x, delta = _layer(g, i, x, delta, lw, seqlens, total, inputs, outputs)
    x, _ = g.add_norm(x, delta, g.weight("model.norm.weight", weights.final_norm))
    logits = _lm_head(g, x, weights)
    rows = 1 if spec.last_row_logits else "sequence_length"
    g.nodes.append(helper.make_node("Identity", [logits], ["logits"], name="logits_out"))
    outputs.insert(
        0, helper.make_tensor_value_info("logits", spec.onnx_dtype, ["batch_size", rows, spec.vocab_size])
    )
    graph = helper.make_graph(g.nodes, "ladder_decoder", inputs, outputs, g.inits)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 10
    if spec.read_rows and not spec.last_row_logits:
        gather_read_rows(model)
    return model


def int4_blocks(w: np.ndarray, block: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """A [K, N] weight as MatMulNBits' B (uint8 [N, K / block, block / 2], element 2i in the low
    nibble) and scales ([N * K / block], the weight's dtype): symmetric, q = round(w / s) + 8 in
    0..15, s = absmax / 7 of the block, so a block's dequantized weights are within s / 2 of w."""
    k, n = w.shape
    if k % block:
        raise ValueError(f"{k} inputs are not whole blocks of {block}")
    blocks = w.T.astype(np.float32).reshape(n, k // block, block)
    scale = np.abs(blocks).max(axis=-1, keepdims=True) / 7
    scale[scale == 0] = 1
    scale = scale.astype(w.dtype).astype(np.float32)  # quantize against the scale the kernel reads
    q = (np.clip(np.rint(blocks / scale), -8, 7) + 8).astype(np.uint8)
    return q[..., 0::2] | (q[..., 1::2] << 4), scale.astype(w.dtype).ravel()


def genai_config(
    spec: DecoderSpec,
    *,
    context_length: int,
    chunk_size: int,
    bos_token_id: int = 1,
    eos_token_id: int | list[int] = 2,
    pad_token_id: int = 0,
    model_type: str = "llama",
) -> dict[str, Any]:
    """A genai_config.json that onnxruntime-genai and Ladder both read."""
    inputs = {
        "attention_mask": "attention_mask",
        "past_key_names": "past_key_values.%d.key",
        "past_value_names": "past_key_values.%d.value",
    }
    inputs["inputs_embeds" if spec.embeddings_input else "input_ids"] = (
        "inputs_embeds" if spec.embeddings_input else "input_ids"
    )
    return {
        "model": {
            "bos_token_id": bos_token_id,
            "context_length": context_length,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": GRAPH_FILE,
                "head_size": spec.head_size,
                "hidden_size": spec.hidden_size,
                "inputs": inputs,
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
                "num_attention_heads": spec.num_heads,
                "num_hidden_layers": spec.num_layers,
                "num_key_value_heads": spec.num_kv_heads,
            },
            "eos_token_id": eos_token_id,
            "pad_token_id": pad_token_id,
            "type": model_type,
            "vocab_size": spec.vocab_size,
        },
        "search": {
            "chunk_size": chunk_size,
            "diversity_penalty": 0.0,
            "do_sample": False,
            "early_stopping": True,
            "length_penalty": 1.0,
            "max_length": context_length,
            "min_length": 0,
            "no_repeat_ngram_size": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": True,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 1,
            "top_p": 1.0,
        },
    }


def write_model_dir(path: Path, model: onnx.ModelProto, config: dict[str, Any]) -> Path:
    """Write the graph, GRAPH_FILE (external data beyond 2 GB), and `genai_config.json` into `path`."""
    path.mkdir(parents=True, exist_ok=True)
    # Summed from the weights: a proto over 2 GB cannot even report its own ByteSize.
    large = sum(len(t.raw_data) for t in model.graph.initializer) > 1_800_000_000
    onnx.save_model(
        model,
        str(path / GRAPH_FILE),
        save_as_external_data=large,
        location=f"{GRAPH_FILE}.data" if large else None,
    )
    (path / "genai_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return path
