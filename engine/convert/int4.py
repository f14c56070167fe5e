"""Q4_1 GGUF matrices as onnxruntime MatMulNBits (4 bits, block 32), weight-exact; Q8_0 as 8 bits.

Q4_1 stores each block of 32 weights as w = d·q + m (q in 0..15, d and m
float16). A float zero point zp = −m/d would map it onto MatMulNBits exactly,
but onnxruntime's CPU kernels run float zero points ~30x slower than integer
ones (measured: 3.9 ms vs 0.012 ms for a 576x1536 row). So the node gets
scale d and integer zero point 0 (the d·q part) and the m part is added as
x @ W_m = blocksum(x) @ M, where blocksum sums each block of 32 inputs and
M [K / 32, N] holds the m's: a matmul 1/32 the size. The weights stay the
GGUF's own values; `quantize_matmuls` swaps the named fp32 MatMul weights of
a built graph for these nodes and leaves everything else untouched.
A Q8_0 tied head (w = d·q, q int8) maps exactly onto bits=8 with zero point
128; `quantize_tied_head` swaps the head's Gemm for it, and `quantize_tied_embedding`
the embedding's Gather for GatherBlockQuantized over the same bytes, so the
float table (113 MB for SmolLM2) is no longer kept at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

BLOCK = 32
Q4_1_BYTES = 20  # d (f16), m (f16), 16 bytes of nibbles


class _Blocks:
    """Rows of blocks of 32 along K: `packed` is [N, K / 32, bytes per block]."""

    packed: np.ndarray

    @property
    def n(self) -> int:
        return int(self.packed.shape[0])

    @property
    def k(self) -> int:
        return int(self.packed.shape[1] * BLOCK)


@dataclass(frozen=True)
class NBitsMatrix(_Blocks):
    """One weight matrix [K in, N out] in MatMulNBits layout."""

    packed: np.ndarray  # uint8 [N, K / 32, 16]: element 2i low nibble, 2i + 1 high
    scales: np.ndarray  # float32 [N * K / 32]: d per block
    offsets: np.ndarray  # float32 [K / 32, N]: m per block, added as blocksum(x) @ offsets

    def dequantize(self) -> np.ndarray:
        """The float32 matrix [K, N] (x @ W layout) these blocks stand for."""
        q = np.stack([self.packed & 0xF, self.packed >> 4], axis=-1).reshape(self.n, -1, BLOCK)
        scaled = q * self.scales.reshape(self.n, -1, 1) + self.offsets.T[..., None]
        return np.ascontiguousarray(scaled.reshape(self.n, self.k).T)

    def rows(self, order: np.ndarray) -> NBitsMatrix:
        """The same matrix with its output rows (N) reordered."""
        nb = self.packed.shape[1]
        return NBitsMatrix(
            self.packed[order],
            self.scales.reshape(-1, nb)[order].ravel(),
            np.ascontiguousarray(self.offsets[:, order]),
        )


def concat_outputs(parts: list[NBitsMatrix]) -> NBitsMatrix:
    """One matrix whose outputs are the parts' outputs in order: x @ [A | B] = [x @ A | x @ B].

    Blocks run along K within each output row, so stacking rows keeps every block intact.
    """
    return NBitsMatrix(
        np.concatenate([m.packed for m in parts]),
        np.concatenate([m.scales for m in parts]),
        np.concatenate([m.offsets for m in parts], axis=1),
    )


def from_q4_1(raw: np.ndarray, n: int, k: int) -> NBitsMatrix:
    """Repack GGUF Q4_1 bytes of an [N out, K in] tensor; weights stay bit-for-bit the same."""
    blocks = np.ascontiguousarray(raw).reshape(n, k // BLOCK, Q4_1_BYTES)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    nibbles = blocks[..., 4:]
    # GGUF: byte j holds element j (low) and j + 16 (high); MatMulNBits wants 2i, 2i + 1.
    q = np.concatenate([nibbles & 0xF, nibbles >> 4], axis=-1)
    packed = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)
    return NBitsMatrix(packed, d.ravel(), np.ascontiguousarray(m.T))


def _matmul_nbits(
    node: onnx.NodeProto,
    name: str,
    w: NBitsMatrix,
    accuracy_level: int,
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """MatMulNBits for the d·q part plus blocksum(x) @ offsets for the m part."""
    x, out = node.input[0], node.output[0]
    blocks = w.k // BLOCK
    inits = [
        numpy_helper.from_array(w.packed, f"{name}.q4"),
        numpy_helper.from_array(w.scales, f"{name}.scales"),
        numpy_helper.from_array(np.zeros((w.n, (blocks + 1) // 2), np.uint8), f"{name}.zero_points"),
        numpy_helper.from_array(w.offsets, f"{name}.offsets"),
        numpy_helper.from_array(np.array([0, 0, blocks, BLOCK], np.int64), f"{name}.block_shape"),
        numpy_helper.from_array(np.array([-1], np.int64), f"{name}.last_axis"),
    ]
    p = f"{node.name}_nbits"
    nodes = [
        helper.make_node(
            "MatMulNBits",
            [x, *(t.name for t in inits[:3])],
            [f"{p}_dq"],
            name=p,
            domain="com.microsoft",
            K=w.k,
            N=w.n,
            bits=4,
            block_size=BLOCK,
            accuracy_level=accuracy_level,
        ),
        helper.make_node("Reshape", [x, inits[4].name], [f"{p}_blocks"], name=f"{p}_reshape"),
        helper.make_node(
            "ReduceSum", [f"{p}_blocks", inits[5].name], [f"{p}_sums"], name=f"{p}_blocksum", keepdims=0
        ),
        helper.make_node("MatMul", [f"{p}_sums", inits[3].name], [f"{p}_m"], name=f"{p}_m"),
        helper.make_node("Add", [f"{p}_dq", f"{p}_m"], [out], name=f"{p}_add"),
    ]
    return nodes, inits


def quantize_matmuls(
    model: onnx.ModelProto, weights: dict[str, NBitsMatrix], accuracy_level: int = 0
) -> onnx.ModelProto:
    """Replace every MatMul whose weight initializer is named in `weights` by MatMulNBits."""
    graph = model.graph
    nodes: list[onnx.NodeProto] = []
    added: list[onnx.TensorProto] = []
    for node in graph.node:
        if node.op_type == "MatMul" and node.input[1] in weights:
            new, inits = _matmul_nbits(node, node.input[1], weights[node.input[1]], accuracy_level)
            nodes.extend(new)
            added.extend(inits)
        else:
            nodes.append(node)
    kept = [t for t in graph.initializer if t.name not in weights]
    missing = set(weights) - {n.input[1] for n in graph.node if n.op_type == "MatMul"}
    if missing:
        raise KeyError(f"no MatMul reads {sorted(missing)[:3]}")
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(kept + added)
    return model


Q8_0_BYTES = 34  # d (f16), 32 int8


@dataclass(frozen=True)
class Int8Matrix(_Blocks):
    """A Q8_0 matrix [N out, K in] (w = d·q, q int8) as MatMulNBits bits=8, exactly.

    q is stored as q + 128 with an integer zero point of 128: no block-sum term needed.
    """

    packed: np.ndarray  # uint8 [N, K / 32, 32]
    scales: np.ndarray  # float32 [N * K / 32]

    def dequantize(self) -> np.ndarray:
        """The float32 matrix [N, K] (row per output, as the GGUF stores it)."""
        q = self.packed.astype(np.float32) - 128
        scaled: np.ndarray = q * self.scales.reshape(self.n, -1, 1)
        return scaled.reshape(self.n, self.k)


def from_q8_0(raw: np.ndarray, n: int, k: int) -> Int8Matrix:
    blocks = np.ascontiguousarray(raw).reshape(n, k // BLOCK, Q8_0_BYTES)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    q = blocks[..., 2:].view(np.int8).astype(np.int16) + 128
    return Int8Matrix(q.astype(np.uint8), d.ravel())


def quantize_tied_head(
    model: onnx.ModelProto, embed_name: str, head: Int8Matrix, accuracy_level: int = 0
) -> onnx.ModelProto:
    """Replace the tied head (Gemm x · embedᵀ) by MatMulNBits bits=8 over the Q8_0 table.

    The float table stays for the embedding Gather; only the head reads the int8 copy,
    which is a quarter of the bytes every decode step streams through it.
    """
    graph = model.graph
    gemm = next(n for n in graph.node if n.op_type == "Gemm" and n.input[1] == embed_name)
    name = f"{embed_name}.head"
    graph.initializer.extend(
        [
            numpy_helper.from_array(head.packed, f"{name}.q8"),
            numpy_helper.from_array(head.scales, f"{name}.scales"),
            numpy_helper.from_array(np.full((head.n, head.k // BLOCK), 128, np.uint8), f"{name}.zero_points"),
        ]
    )
    new = helper.make_node(
        "MatMulNBits",
        [gemm.input[0], f"{name}.q8", f"{name}.scales", f"{name}.zero_points"],
        list(gemm.output),
        name=f"{gemm.name}_nbits",
        domain="com.microsoft",
        K=head.k,
        N=head.n,
        bits=8,
        block_size=BLOCK,
        accuracy_level=accuracy_level,
    )
    index = list(graph.node).index(gemm)
    graph.node.remove(gemm)
    graph.node.insert(index, new)
    return model


def quantize_tied_embedding(model: onnx.ModelProto, embed_name: str, head: Int8Matrix) -> onnx.ModelProto:
    """Replace the embedding's Gather over the float table by GatherBlockQuantized over the Q8_0 table
    `quantize_tied_head` added (the same values, d·q, bit for bit); drop the float table when unused.

    The table is gathered as [vocab, K / 32, 32] blocks (the head's layout, one initializer for
    both) and each row reshaped back to [.., K]."""
    graph = model.graph
    gather = next(n for n in graph.node if n.op_type == "Gather" and n.input[0] == embed_name)
    name = f"{embed_name}.head"
    blocks = head.k // BLOCK
    graph.initializer.extend(
        [
            numpy_helper.from_array(head.scales.reshape(head.n, blocks, 1), f"{name}.row_scales"),
            numpy_helper.from_array(np.full((head.n, blocks, 1), 128, np.uint8), f"{name}.row_zero_points"),
            numpy_helper.from_array(np.array([0, 0, head.k], np.int64), f"{name}.row_shape"),
        ]
    )
    p = f"{gather.name}_q8"
    new = [
        helper.make_node(
            "GatherBlockQuantized",
            [f"{name}.q8", gather.input[1], f"{name}.row_scales", f"{name}.row_zero_points"],
            [f"{p}_blocks"],
            name=p,
            domain="com.microsoft",
            bits=8,
            block_size=BLOCK,
            gather_axis=0,
            quantize_axis=2,
        ),
        helper.make_node(
            "Reshape", [f"{p}_blocks", f"{name}.row_shape"], list(gather.output), name=f"{p}_rows"
        ),
    ]
    index = list(graph.node).index(gather)
    graph.node.remove(gather)
    for offset, node in enumerate(new):
        graph.node.insert(index + offset, node)
    if not any(embed_name in n.input for n in graph.node):
        kept = [t for t in graph.initializer if t.name != embed_name]
        del graph.initializer[:]
        graph.initializer.extend(kept)
    return model
