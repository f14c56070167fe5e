"""Synthetic decoders as the benchmarks on the H200 need them (issue 28): int4 layer matrices as
onnxruntime-genai's builder writes them (MatMulNBits, 4 bits, blocks of 32), and 8B-class models
drawn in seconds by repeating the first layer's weights, and residual Adds fused into the norms
after them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from engine.executor import EngineOptions
from engine.executor.engine import Engine
from engine.model import GRAPH_FILE
from engine.modelgen.builder import int4_blocks
from engine.modelgen.synthetic import TINY, build_synthetic
from tests.support.prompts import prompt_ids

LAYER_MATRICES = 7  # q, k, v, o, gate, up, down
PACKED_MATRICES = 4  # q|k|v, o, gate|up, down


def graph(path: Path) -> onnx.GraphProto:
    return onnx.load(str(path / GRAPH_FILE)).graph


def ops(path: Path, op_type: str) -> list[onnx.NodeProto]:
    return [n for n in graph(path).node if n.op_type == op_type]


def first_logits(path: Path, prompt: list[int]) -> np.ndarray:
    engine = Engine.load(path, EngineOptions(capacity=256, max_sessions=1, intra_op_threads=1))
    session = engine.open_session()
    engine.append(session, prompt)
    return engine.logits(session).astype(np.float32)


def test_int4_blocks_dequantize_to_within_half_a_scale_of_the_weights() -> None:
    w = np.random.default_rng(0).standard_normal((96, 40)).astype(np.float32)
    packed, scales = int4_blocks(w, 32)
    assert packed.shape == (40, 3, 16) and packed.dtype == np.uint8 and scales.shape == (120,)
    q = np.stack([packed & 15, packed >> 4], axis=-1).reshape(40, 3, 32).astype(np.float32) - 8
    back = (q * scales.reshape(40, 3, 1)).reshape(40, 96).T
    assert np.all(np.abs(back - w) <= np.repeat(scales.reshape(40, 3), 32, axis=1).T / 2 + 1e-6)


def test_int4_blocks_refuse_inputs_that_are_not_whole_blocks() -> None:
    with pytest.raises(ValueError, match="whole blocks"):
        int4_blocks(np.ones((40, 8), np.float32), 32)


@pytest.mark.parametrize(("packed", "per_layer"), [(False, LAYER_MATRICES), (True, PACKED_MATRICES)])
def test_an_int4_decoder_runs_every_layer_matrix_as_matmulnbits_and_no_float_copy(
    tmp_path: Path, packed: bool, per_layer: int
) -> None:
    path = build_synthetic(replace(TINY, int4_block=32, packed_projections=packed), tmp_path)
    nbits = ops(path, "MatMulNBits")
    assert len(nbits) == TINY.num_layers * per_layer
    assert {a.name: a.i for n in nbits for a in n.attribute if a.name in ("bits", "block_size")} == {
        "bits": 4,
        "block_size": 32,
    }
    floats = {i.name for i in graph(path).initializer if i.data_type == onnx.TensorProto.FLOAT}
    assert not any(name.endswith("proj.weight") for name in floats)  # only their scales are float


def test_an_int4_decoder_computes_what_its_float_model_does_within_quantization_error(tmp_path: Path) -> None:
    prompt = prompt_ids(20, seed=3)
    exact = first_logits(build_synthetic(TINY, tmp_path), prompt)
    quantized = first_logits(build_synthetic(replace(TINY, int4_block=32), tmp_path), prompt)
    assert not np.array_equal(exact, quantized)  # it is quantized
    assert np.corrcoef(exact, quantized)[0, 1] > 0.95


def test_repeated_layers_store_the_first_layers_weights_once_per_layer(tmp_path: Path) -> None:
    path = build_synthetic(TINY, tmp_path, repeat_layers=True)
    weights = {i.name: numpy_helper.to_array(i) for i in graph(path).initializer}
    for name in ("attn.q_proj.weight", "mlp.down_proj.weight"):
        assert np.array_equal(weights[f"model.layers.0.{name}"], weights[f"model.layers.1.{name}"])
    assert path != build_synthetic(TINY, tmp_path)  # another model than the distinct layers' one


def test_fused_norms_replace_every_residual_add_and_leave_the_logits_as_they_were(tmp_path: Path) -> None:
    spec = replace(TINY, num_layers=3)
    plain, fused = (build_synthetic(replace(spec, fused_norms=f), tmp_path) for f in (False, True))
    assert not ops(plain, "SkipSimplifiedLayerNormalization")
    assert len(ops(plain, "Add")) - len(ops(fused, "Add")) == 2 * spec.num_layers
    # Every norm but the first layer's (nothing to add before it) takes its residual Add in.
    assert len(ops(fused, "SkipSimplifiedLayerNormalization")) == 2 * spec.num_layers
    prompt = prompt_ids(37, seed=3, vocab=spec.vocab_size)
    np.testing.assert_allclose(first_logits(fused, prompt), first_logits(plain, prompt), atol=1e-4)
