"""Peer agreement: onnxruntime-genai (CPU) runs the converted directory to the same greedy tokens.

The directory is the int4 conversion: the one a CPU server converts and serves by default (and a
third of the fp32 one's time here: its weights are a fifth of the bytes each decode step reads)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from engine.tokenizer import Tokenizer
from tests.support import engines
from tests.support.engines import greedy_from_prompt, load_default

og = pytest.importorskip("onnxruntime_genai")

PROMPTS = [
    "The capital of France is",
    "<|im_start|>user\nName three primary colours.<|im_end|>\n<|im_start|>assistant\n",
    'def add(a, b):\n    """Return the sum of a and b."""\n',
]
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def model_dir(default_model: Callable[..., Path]) -> Path:
    return default_model("int4")


@pytest.fixture(scope="module")
def genai_model(model_dir: Path) -> og.Model:
    """onnxruntime-genai's model on the converted directory, loaded once for the module (with this
    worker's share of the cores, as Ladder's engine has)."""
    config = og.Config(str(model_dir))
    if engines.INTRA_OP_THREADS:
        options = {"intra_op_num_threads": engines.INTRA_OP_THREADS}
        config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
    return og.Model(config)


def genai_greedy(model: og.Model, prompt: list[int]) -> list[int]:
    params = og.GeneratorParams(model)
    params.set_search_options(
        do_sample=False, max_length=len(prompt) + NEW_TOKENS, min_length=len(prompt) + NEW_TOKENS
    )
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)
    out: list[int] = []
    while not generator.is_done():
        generator.generate_next_token()
        out.append(int(generator.get_next_tokens()[0]))
    return out


def test_onnxruntime_genai_tokenizes_like_ladder(model_dir: Path, genai_model: og.Model) -> None:
    ours = Tokenizer(model_dir)
    theirs = og.Tokenizer(genai_model)
    for prompt in PROMPTS:
        assert list(theirs.encode(prompt)) == ours.encode(prompt)


def test_onnxruntime_genai_and_ladder_give_the_same_greedy_tokens(
    model_dir: Path, genai_model: og.Model
) -> None:
    tokenizer = Tokenizer(model_dir)
    engine = load_default(model_dir)
    # onnxruntime-genai decodes one stream one row per forward: compare the same kernels. (On a CPU
    # whose one-row kernel gives other numerics, Ladder's own decode binds two rows: kernels.py.)
    engine.follow(replace(engine.kernels, least_decode_batch=1))
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        assert genai_greedy(genai_model, ids) == greedy_from_prompt(engine, ids, NEW_TOKENS), prompt
