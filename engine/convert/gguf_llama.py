"""Reading a llama-architecture GGUF into `DecoderSpec` + `DecoderWeights` and its tokenizer.

Guarantees: weights are the GGUF's own values dequantized to float32 (no
re-quantization); Q and K are un-permuted from llama.cpp's rotary layout back
to the Hugging Face layout, so the graph uses half-split rotary
(`rotary_interleaved=False`); tied embeddings stay tied (`lm_head=None`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from engine.convert.int4 import Int8Matrix, NBitsMatrix, concat_outputs, from_q4_1, from_q8_0
from engine.convert.tokenizer_json import BpeVocabulary
from engine.modelgen.builder import DecoderSpec, DecoderWeights, LayerWeights

_TOKEN_TYPE_CONTROL = 3


class GgufModel:
    """An open GGUF file: metadata fields by key and tensors by name."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.reader = GGUFReader(str(path))
        self.tensors = {t.name: t for t in self.reader.tensors}

    def field(self, key: str) -> Any:
        return self.reader.fields[key].contents()

    def has_field(self, key: str) -> bool:
        return key in self.reader.fields

    def dequantized(self, name: str) -> np.ndarray:
        """The tensor as float32, numpy shape [rows, cols] = GGUF ne reversed ([out, in])."""
        t = self.tensors[name]
        return np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)


def llama_spec(model: GgufModel, *, context_length: int) -> DecoderSpec:
    """The decoder shape the GGUF declares, with rotary caches for `context_length` rows."""
    arch = model.field("general.architecture")
    if arch != "llama":
        raise ValueError(f"expected a llama-architecture GGUF, got {arch!r}")
    hidden = int(model.field("llama.embedding_length"))
    heads = int(model.field("llama.attention.head_count"))
    return DecoderSpec(
        vocab_size=len(model.field("tokenizer.ggml.tokens")),
        hidden_size=hidden,
        intermediate_size=int(model.field("llama.feed_forward_length")),
        num_layers=int(model.field("llama.block_count")),
        num_heads=heads,
        num_kv_heads=int(model.field("llama.attention.head_count_kv")),
        head_size=hidden // heads,
        rope_theta=float(model.field("llama.rope.freq_base")),
        rms_eps=float(model.field("llama.attention.layer_norm_rms_epsilon")),
        rotary_rows=context_length,
        rotary_interleaved=False,
        packed_projections=True,
        # The directory stays the plain onnxruntime-genai layout (its CUDA graphs cannot capture the
        # read-rows gather); the engine gathers the read rows in a cached copy on CPU (engine/head.py).
        read_rows=False,
    )


def unpermute_rotary_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation ([out, in]): pairs (2i, 2i+1) -> halves (i, i + d/2).

    llama.cpp's converter reorders each head's rows so adjacent-pair rotary
    equals Hugging Face's half-split rotary; this is its inverse.
    """
    out, cols = w.shape
    half = out // heads // 2
    return w.reshape(heads, half, 2, cols).swapaxes(1, 2).reshape(out, cols)


def _layer(model: GgufModel, spec: DecoderSpec, i: int) -> LayerWeights:
    def mat(name: str) -> np.ndarray:
        return np.ascontiguousarray(model.dequantized(f"blk.{i}.{name}.weight").T)

    def rotary(name: str, heads: int) -> np.ndarray:
        w = unpermute_rotary_rows(model.dequantized(f"blk.{i}.{name}.weight"), heads)
        return np.ascontiguousarray(w.T)

    return LayerWeights(
        attn_norm=model.dequantized(f"blk.{i}.attn_norm.weight"),
        q=rotary("attn_q", spec.num_heads),
        k=rotary("attn_k", spec.num_kv_heads),
        v=mat("attn_v"),
        o=mat("attn_output"),
        mlp_norm=model.dequantized(f"blk.{i}.ffn_norm.weight"),
        gate=mat("ffn_gate"),
        up=mat("ffn_up"),
        down=mat("ffn_down"),
    )


def llama_weights(model: GgufModel, spec: DecoderSpec) -> DecoderWeights:
    """All weights as float32, stored [in, out]; `lm_head` only if the GGUF has `output.weight`."""
    head = None
    if "output.weight" in model.tensors:
        head = np.ascontiguousarray(model.dequantized("output.weight").T)
    return DecoderWeights(
        embed=model.dequantized("token_embd.weight"),
        layers=[_layer(model, spec, i) for i in range(spec.num_layers)],
        final_norm=model.dequantized("output_norm.weight"),
        lm_head=head,
    )


def gguf_vocabulary(model: GgufModel) -> BpeVocabulary:
    """The GGUF's GPT-2 style byte-level BPE tokenizer, specials and chat template."""
    if model.field("tokenizer.ggml.model") != "gpt2":
        raise ValueError("only byte-level BPE ('gpt2') GGUF tokenizers are supported")
    types = list(model.field("tokenizer.ggml.token_type"))
    pre = model.field("tokenizer.ggml.pre") if model.has_field("tokenizer.ggml.pre") else ""
    eos = int(model.field("tokenizer.ggml.eos_token_id"))
    return BpeVocabulary(
        tokens=list(model.field("tokenizer.ggml.tokens")),
        merges=list(model.field("tokenizer.ggml.merges")),
        special_ids=[i for i, t in enumerate(types) if t == _TOKEN_TYPE_CONTROL],
        bos_token_id=int(model.field("tokenizer.ggml.bos_token_id")),
        eos_token_id=eos,
        unk_token_id=int(model.field("tokenizer.ggml.unknown_token_id")),
        pad_token_id=int(model.field("tokenizer.ggml.padding_token_id")),
        chat_template=str(model.field("tokenizer.chat_template")),
        split_digits=pre == "smollm",
    )


# GGUF tensor name -> the builder's initializer name for the same matrix.
BUILDER_NAMES = {
    "attn_q": "attn.q_proj",
    "attn_k": "attn.k_proj",
    "attn_v": "attn.v_proj",
    "attn_output": "attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def llama_nbits(model: GgufModel, spec: DecoderSpec) -> dict[str, NBitsMatrix]:
    """Every Q4_1 layer matrix as MatMulNBits blocks, keyed by the builder's weight name.

    Q and K rows get the same un-permutation as the float path.
    """
    heads = {"attn_q": spec.num_heads, "attn_k": spec.num_kv_heads}
    out: dict[str, NBitsMatrix] = {}
    for i in range(spec.num_layers):
        for gguf_name, builder_name in BUILDER_NAMES.items():
            t = model.tensors[f"blk.{i}.{gguf_name}.weight"]
            if t.tensor_type != GGMLQuantizationType.Q4_1:
                continue
            k, n = (int(x) for x in t.shape)  # GGUF ne order: [in, out]
            matrix = from_q4_1(t.data, n, k)
            if gguf_name in heads:
                order = unpermute_rotary_rows(np.arange(n)[:, None], heads[gguf_name])[:, 0]
                matrix = matrix.rows(order)
            out[f"model.layers.{i}.{builder_name}.weight"] = matrix
    return _packed(out, spec) if spec.packed_projections else out


PACKS = {
    "attn.qkv_proj": ("attn.q_proj", "attn.k_proj", "attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


def _packed(matrices: dict[str, NBitsMatrix], spec: DecoderSpec) -> dict[str, NBitsMatrix]:
    """Merge the parts of each packed projection; a pack with a part not in Q4_1 stays float."""
    out = dict(matrices)
    for i in range(spec.num_layers):
        for pack, parts in PACKS.items():
            names = [f"model.layers.{i}.{part}.weight" for part in parts]
            found = [out.pop(name) for name in names if name in out]
            if len(found) == len(names):
                out[f"model.layers.{i}.{pack}.weight"] = concat_outputs(found)
    return out


def llama_int8_head(model: GgufModel) -> Int8Matrix | None:
    """The tied head as Q8_0 blocks (exact), when the GGUF ties it and stores it as Q8_0."""
    t = model.tensors["token_embd.weight"]
    if "output.weight" in model.tensors or t.tensor_type != GGMLQuantizationType.Q8_0:
        return None
    k, n = (int(x) for x in t.shape)
    return from_q8_0(t.data, n, k)
