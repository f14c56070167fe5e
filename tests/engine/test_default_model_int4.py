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
from tests.engine.test_default_model import LONE_USER_TURN


@pytest.fixture(scope="module")
def cache_root(request: pytest.FixtureRequest) -> Path:
    return Path(request.config.cache.mkdir("ladder-default-model"))


@pytest.fixture(scope="module")
def gguf(cache_root: Path) -> GgufModel:
    prepare(cache_root)  # fetches the GGUF if this module runs alone
    return GgufModel(cache_root / "downloads" / GGUF_NAME)


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
        cache_root: Path, gguf: GgufModel) -> None:
    model_dir = prepare(cache_root, precision="int4").model_dir
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


def test_the_int4_model_answers_the_lone_user_turn_with_paris(cache_root: Path) -> None:
    model_dir = prepare(cache_root, precision="int4").model_dir
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
