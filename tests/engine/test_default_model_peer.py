"""Peer agreement: onnxruntime-genai (CPU) runs the converted directory to the same greedy tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.default_model import prepare_default_model
from engine.executor import Engine, EngineOptions
from engine.tokenizer import Tokenizer
from tests.support.engines import greedy_from_prompt

og = pytest.importorskip("onnxruntime_genai")

PROMPTS = ["The capital of France is",
           "<|im_start|>user\nName three primary colours.<|im_end|>\n<|im_start|>assistant\n",
           "def add(a, b):\n    \"\"\"Return the sum of a and b.\"\"\"\n"]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def model_dir(default_model_root: Path) -> Path:
    return prepare_default_model(default_model_root)


def genai_greedy(model: og.Model, prompt: list[int]) -> list[int]:
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + NEW_TOKENS,
                              min_length=len(prompt) + NEW_TOKENS)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)
    out: list[int] = []
    while not generator.is_done():
        generator.generate_next_token()
        out.append(int(generator.get_next_tokens()[0]))
    return out


def test_onnxruntime_genai_tokenizes_like_ladder(model_dir: Path) -> None:
    ours = Tokenizer(model_dir)
    theirs = og.Tokenizer(og.Model(str(model_dir)))
    for prompt in PROMPTS:
        assert list(theirs.encode(prompt)) == ours.encode(prompt)


def test_onnxruntime_genai_and_ladder_give_the_same_greedy_tokens(model_dir: Path) -> None:
    tokenizer = Tokenizer(model_dir)
    engine = Engine.load(model_dir, EngineOptions())
    model = og.Model(str(model_dir))
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        assert genai_greedy(model, ids) == greedy_from_prompt(engine, ids, NEW_TOKENS), prompt
