"""The fp16 variant (the CUDA default): the dequantized weights in half precision, still right."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import onnx
import pytest

from engine.executor.engine import Engine
from engine.tokenizer import Tokenizer
from tests.support.engines import greedy_by_appending, load_default
from tests.support.models import LONE_USER_TURN


@pytest.fixture(scope="module")
def model_dir(default_model: Callable[..., Path]) -> Path:
    return default_model("fp16")


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Engine:
    return load_default(model_dir, max_sessions=1)


def test_the_fp16_model_holds_its_weights_and_kv_in_half_precision(model_dir: Path, engine: Engine) -> None:
    graph = onnx.load(str(model_dir / "model.onnx"), load_external_data=False).graph
    kinds = {t.data_type for t in graph.initializer if len(t.dims) == 2 and min(t.dims) >= 64}
    assert kinds == {onnx.TensorProto.FLOAT16}
    assert engine.info.kv_dtype == "float16"


def test_the_fp16_model_answers_the_readme_prompt_and_the_chat_question(
    model_dir: Path, engine: Engine
) -> None:
    tokenizer = Tokenizer(model_dir)
    readme = tokenizer.encode("The capital of France is")
    assert tokenizer.decode(greedy_by_appending(engine, readme, 1)) == " Paris"
    answer = tokenizer.decode(greedy_by_appending(engine, tokenizer.encode(LONE_USER_TURN), 7))
    assert answer == "The capital of France is Paris."
