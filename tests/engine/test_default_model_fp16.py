"""The fp16 variant (the CUDA default): the dequantized weights in half precision, still right."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from engine.default_model import prepare
from engine.executor import Engine, EngineOptions
from engine.tokenizer import Tokenizer
from tests.engine.test_default_model import LONE_USER_TURN


@pytest.fixture(scope="module")
def model_dir(request: pytest.FixtureRequest) -> Path:
    return prepare(Path(request.config.cache.mkdir("ladder-default-model")), precision="fp16").model_dir


def greedy(engine: Engine, prompt: list[int], n: int) -> list[int]:
    session = engine.open_session()
    logits, out = engine.append(session, prompt), []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = engine.append(session, [out[-1]])
    engine.close_session(session)
    return out


def test_the_fp16_model_holds_its_weights_and_kv_in_half_precision(model_dir: Path) -> None:
    graph = onnx.load(str(model_dir / "model.onnx"), load_external_data=False).graph
    kinds = {t.data_type for t in graph.initializer if len(t.dims) == 2 and min(t.dims) >= 64}
    assert kinds == {onnx.TensorProto.FLOAT16}
    assert Engine.load(model_dir, EngineOptions(max_sessions=1)).info.kv_dtype == "float16"


def test_the_fp16_model_answers_the_readme_prompt_and_the_chat_question(model_dir: Path) -> None:
    tokenizer, engine = Tokenizer(model_dir), Engine.load(model_dir, EngineOptions(max_sessions=1))
    assert tokenizer.decode(greedy(engine, tokenizer.encode("The capital of France is"), 1)) == " Paris"
    answer = tokenizer.decode(greedy(engine, tokenizer.encode(LONE_USER_TURN), 7))
    assert answer == "The capital of France is Paris."
