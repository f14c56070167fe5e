"""The int4 variant (the CPU default): the GGUF's own Q4_1 weights as MatMulNBits, bit-exact, still right."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.convert.gguf_llama import (
    GgufModel,
    llama_int8_head,
    llama_nbits,
    llama_spec,
    llama_weights,
)
from engine.default_model import GGUF_NAME, prepare
from engine.executor import Engine, EngineOptions
from engine.modelgen.reference import reference_logits
from engine.tokenizer import Tokenizer
from tests.support.models import LONE_USER_TURN


@pytest.fixture(scope="module")
def gguf(default_model_root: Path) -> GgufModel:
    prepare(default_model_root)  # fetches the GGUF if this module runs alone
    return GgufModel(default_model_root / "downloads" / GGUF_NAME)


def test_int4_and_int8_head_blocks_dequantize_to_exactly_the_gguf_weights(gguf: GgufModel) -> None:
    spec = llama_spec(gguf, context_length=4096)
    nbits = llama_nbits(gguf, spec)
    weights = llama_weights(gguf, spec)
    assert spec.packed_projections
    assert len(nbits) == 4 * spec.num_layers  # q|k|v, o, gate|up, down
    for i in (0, spec.num_layers - 1):
        layer = weights.layers[i]
        expected = {"attn.qkv_proj": np.concatenate([layer.q, layer.k, layer.v], axis=1),
                    "attn.o_proj": layer.o, "mlp.down_proj": layer.down,
                    "mlp.gate_up_proj": np.concatenate([layer.gate, layer.up], axis=1)}
        for name, matrix in expected.items():
            got = nbits[f"model.layers.{i}.{name}.weight"].dequantize()
            np.testing.assert_array_equal(got, matrix)
    head = llama_int8_head(gguf)
    assert head is not None
    np.testing.assert_array_equal(head.dequantize(), weights.embed)


def test_the_int4_model_tracks_the_fp32_reference_and_says_paris(
        default_model_root: Path, gguf: GgufModel) -> None:
    model_dir = prepare(default_model_root, precision="int4").model_dir
    tokenizer = Tokenizer(model_dir)
    tokens = tokenizer.encode("The capital of France is")
    spec = llama_spec(gguf, context_length=4096)
    ref = reference_logits(spec, llama_weights(gguf, spec), tokens)[-1]
    engine = Engine.load(model_dir, EngineOptions())
    session = engine.open_session()
    got = engine.append(session, tokens)
    engine.close_session(session)
    # The weights are exact, but accuracy_level 4 quantizes activations to int8 per block:
    # measured here, logits move by up to ~2.3 (of ~20) while their shape is kept.
    assert np.corrcoef(got, ref)[0, 1] > 0.99
    top = np.argsort(got)[::-1]
    assert tokenizer.decode([int(top[0])]) == " Paris"
    assert got[top[0]] - got[top[1]] > 1.5


def test_the_int4_model_answers_the_lone_user_turn_with_paris(default_model_root: Path) -> None:
    model_dir = prepare(default_model_root, precision="int4").model_dir
    tokenizer = Tokenizer(model_dir)
    prompt = tokenizer.encode(LONE_USER_TURN)
    engine = Engine.load(model_dir, EngineOptions())
    session = engine.open_session()
    logits, answer = engine.append(session, prompt), []
    for _ in range(7):
        answer.append(int(np.argmax(logits)))
        logits = engine.append(session, [answer[-1]])
    engine.close_session(session)
    assert tokenizer.decode(answer) == "The capital of France is Paris."


def test_the_int4_model_keeps_no_float_embedding_table_and_its_rows_are_the_gguf_rows(
        default_model_root: Path, gguf: GgufModel) -> None:
    import onnx
    import onnxruntime as ort
    from onnx import helper

    model = onnx.load(str(prepare(default_model_root, precision="int4").model_dir / "model.onnx"))
    names = {t.name for t in model.graph.initializer}
    assert "model.embed_tokens.weight" not in names and "model.embed_tokens.weight.head.q8" in names
    # The embedding alone, cut out of the graph: its rows are the GGUF's dequantized rows, bit for bit.
    gather = next(n for n in model.graph.node if n.op_type == "GatherBlockQuantized")
    reshape = next(n for n in model.graph.node if gather.output[0] in n.input)
    used = {*gather.input, *reshape.input}
    graph = helper.make_graph(
        [gather, reshape], "embedding",
        [helper.make_tensor_value_info("input_ids", onnx.TensorProto.INT64, [1, "rows"])],
        [helper.make_tensor_value_info(reshape.output[0], onnx.TensorProto.FLOAT, None)],
        [t for t in model.graph.initializer if t.name in used])
    embedding = helper.make_model(graph, opset_imports=list(model.opset_import))
    embedding.ir_version = model.ir_version
    session = ort.InferenceSession(embedding.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = np.array([[0, 1, 2, 500, 49151]])
    (rows,) = session.run(None, {"input_ids": ids})
    want = llama_weights(gguf, llama_spec(gguf, context_length=4096)).embed[ids[0]]
    np.testing.assert_array_equal(rows[0], want)
