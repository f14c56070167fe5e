"""The runtime tokenizer: token-exact with llama.cpp on the SmolLM2 GGUF, lossless on any text."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from onnxruntime_extensions import pp_api

from engine.chat_messages import ChatMessage
from engine.convert.tokenizer_json import write_byte_level_tokenizer
from engine.tokenizer import Tokenizer, TokenizerUnreadable

# llama.cpp (llama-cpp-python 0.3.36) on the same GGUF, special tokens parsed, no BOS:
# copied from ../shared/data/smollm2-reference.json so CI needs no shared directory.
LLAMA_CPP_IDS: dict[str, list[int]] = {
    "Hello world": [19556, 905],
    "12345 apples": [33, 34, 35, 36, 37, 13855],
    "Ünïcödé ✓ naïve café": [142, 246, 94, 25972, 83, 7466, 84, 2756, 4636, 246, 237, 15486, 46494, 37366],
    " leading space": [2899, 1898],
    "def f(x):\n    return x*2": [1604, 275, 24, 104, 727, 472, 1003, 1792, 26, 34],
    "<|im_start|>user\nHi<|im_end|>\n": [1, 4093, 198, 26843, 2, 198],
    "The quick brown fox jumps over the lazy dog.": [
        504,
        2365,
        6354,
        16438,
        27003,
        690,
        260,
        23790,
        2767,
        30,
    ],
    "日本語のテキスト": [
        23274,
        115,
        40993,
        179,
        120,
        248,
        26453,
        11100,
        224,
        10391,
        251,
        10391,
        134,
        11100,
        226,
    ],
    "2026-11-29: 3.14159 × 2 = 6.28318": [
        34,
        32,
        34,
        38,
        29,
        33,
        33,
        29,
        34,
        41,
        42,
        216,
        35,
        30,
        33,
        36,
        33,
        37,
        41,
        15493,
        216,
        34,
        446,
        216,
        38,
        30,
        34,
        40,
        35,
        33,
        40,
    ],
}
ROUND_TRIP = [
    "Grüße aus Köln — naïve façade",
    "emoji 🎉🚀 and ZWJ 👩‍💻",
    "Ελληνικά, русский, العربية",
    "tabs\tand\nnewlines\r\n  spaces   ",
    "数字 123 and 4.5e-6",
    "",
]


@pytest.fixture(scope="module")
def tokenizer(default_model: Callable[..., Path]) -> Tokenizer:
    return Tokenizer(default_model())


@pytest.mark.parametrize("text", list(LLAMA_CPP_IDS))
def test_the_tokenizer_reproduces_llama_cpp_ids_token_for_token(tokenizer: Tokenizer, text: str) -> None:
    assert tokenizer.encode(text) == LLAMA_CPP_IDS[text]


@pytest.mark.parametrize("text", ROUND_TRIP + list(LLAMA_CPP_IDS))
def test_decoding_an_encoding_gives_back_the_text(tokenizer: Tokenizer, text: str) -> None:
    assert tokenizer.decode(tokenizer.encode(text), skip_special=False) == text


@pytest.mark.parametrize("text", ROUND_TRIP + list(LLAMA_CPP_IDS))
def test_streamed_pieces_concatenate_to_the_full_decode_and_never_split_a_character(
    tokenizer: Tokenizer, text: str
) -> None:
    pieces = list(tokenizer.stream().pieces(tokenizer.encode(text)))
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)


def test_skipping_special_tokens_drops_only_them(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("<|im_start|>user\nHi<|im_end|>\n")
    assert tokenizer.decode(ids) == "user\nHi\n"
    assert "".join(tokenizer.stream(skip_special=True).pieces(ids)) == "user\nHi\n"


def test_special_ids_and_vocabulary_size_are_the_gguf_ones(tokenizer: Tokenizer) -> None:
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (1, 2)
    assert tokenizer.vocab_size == 49152
    assert tokenizer.encode("Hi", add_bos=True)[0] == 1


@pytest.mark.parametrize("system", [None, "Be brief."])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_the_python_chat_rendering_equals_the_gguf_jinja_template(
    tokenizer: Tokenizer, system: str | None, add_generation_prompt: bool
) -> None:
    turns = [
        ChatMessage("user", "What is the capital of France?"),
        ChatMessage("assistant", "Paris."),
        ChatMessage("user", "And of Italy?"),
    ]
    if system is not None:
        turns.insert(0, ChatMessage("system", system))
    ours = tokenizer.render_chat(turns, add_generation_prompt=add_generation_prompt)
    # onnxruntime-extensions renders the template's Jinja in C++: an independent oracle.
    oracle = pp_api.Tokenizer(str(tokenizer.model_dir)).apply_chat_template(
        json.dumps([vars(m) for m in turns]), add_generation_prompt=add_generation_prompt
    )
    assert ours == str(oracle)
    assert ours.startswith("<|im_start|>system\n" + (system or "You are a helpful AI"))


def test_a_model_without_a_chat_template_gets_plain_chatml(tmp_path: Path) -> None:
    write_byte_level_tokenizer(tmp_path, 512)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    text = Tokenizer(tmp_path).render_chat([ChatMessage("user", "Hi")])
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize("vocab_size", [259, 512, 1000])
def test_the_byte_level_tokenizer_encodes_any_text_within_its_vocabulary(
    tmp_path: Path, vocab_size: int
) -> None:
    write_byte_level_tokenizer(tmp_path, vocab_size)
    tok = Tokenizer(tmp_path)
    assert tok.vocab_size == vocab_size
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 2)
    for text in ROUND_TRIP + ["the theory of the thing", "<|im_start|>user\nhi<|im_end|>\n"]:
        ids = tok.encode(text)
        assert all(0 <= i < vocab_size for i in ids)
        assert tok.decode(ids, skip_special=False) == text
        assert "".join(tok.stream().pieces(ids)) == text
    assert tok.decode(list(range(vocab_size)), skip_special=False).startswith("<|endoftext|>")


def test_the_byte_level_tokenizer_uses_its_merges_and_specials(tmp_path: Path) -> None:
    write_byte_level_tokenizer(tmp_path, 512)
    tok = Tokenizer(tmp_path)
    assert tok.encode("<|im_start|>") == [1]
    assert len(tok.encode(" the theory")) < len(b" the theory")
    assert tok.encode("A") == [3 + ord("A")]


def _set_class(model_dir: Path, tokenizer_class: str | None) -> None:
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config.pop("tokenizer_class")
    if tokenizer_class is not None:
        config["tokenizer_class"] = tokenizer_class
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("tokenizer_class", ["TokenizersBackend", None])
def test_a_bpe_tokenizer_under_a_class_the_extension_does_not_know_reads_as_the_fast_one(
    tmp_path: Path, tokenizer_class: str | None
) -> None:
    known, unknown = tmp_path / "known", tmp_path / "unknown"
    for path in (known, unknown):
        write_byte_level_tokenizer(path, 512)
    _set_class(known, "PreTrainedTokenizerFast")
    _set_class(unknown, tokenizer_class)
    before = (unknown / "tokenizer_config.json").read_bytes()
    text = "<|im_start|>user\nthe theory of everything<|im_end|>"
    assert Tokenizer(unknown).encode(text) == Tokenizer(known).encode(text)
    assert (unknown / "tokenizer_config.json").read_bytes() == before  # the user's file is left alone
    assert sorted(p.name for p in unknown.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]


def _unigram_tokenizer(model_dir: Path, tokenizer_class: str) -> None:
    """A SentencePiece-style Unigram tokenizer.json: pieces with scores, U+2581 for spaces."""
    pieces = [
        ["<unk>", 0.0],
        ["<s>", 0.0],
        ["</s>", 0.0],
        ["\u2581", -2.0],
        ["\u2581hello", -3.0],
        ["\u2581world", -3.5],
        *[[c, -5.0] for c in "helowrd"],
        ["\u2581he", -4.0],
        ["llo", -4.5],
    ]
    metaspace = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True}
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "normalizer": None,
        "added_tokens": [
            {
                "id": i,
                "content": c,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for i, c in enumerate(["<unk>", "<s>", "</s>"])
        ],
        "pre_tokenizer": metaspace,
        "post_processor": None,
        "decoder": metaspace,
        "model": {"type": "Unigram", "unk_id": 0, "vocab": pieces, "byte_fallback": False},
    }
    model_dir.mkdir()
    (model_dir / "tokenizer.json").write_text(json.dumps(doc))
    (model_dir / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": tokenizer_class,
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
            }
        )
    )


def test_a_unigram_tokenizer_under_an_unknown_class_reads_and_streams_like_its_decode(tmp_path: Path) -> None:
    _unigram_tokenizer(tmp_path / "unigram", "TokenizersBackend")
    tok = Tokenizer(tmp_path / "unigram")
    ids = tok.encode("hello world")
    assert ids == [4, 5]
    assert (tok.bos_token_id, tok.eos_token_id, tok.vocab_size) == (1, 2, 15)
    assert tok.decode(ids, skip_special=False) == "hello world"
    assert "".join(tok.stream().pieces(ids)) == "hello world"


def test_a_tokenizer_nothing_reads_is_unreadable_not_a_crash(tmp_path: Path) -> None:
    write_byte_level_tokenizer(tmp_path, 512)
    _set_class(tmp_path, "WeirdTokenizer")
    doc = json.loads((tmp_path / "tokenizer.json").read_text())
    doc["model"]["type"] = "WordLevel"
    (tmp_path / "tokenizer.json").write_text(json.dumps(doc))
    with pytest.raises(TokenizerUnreadable, match="WeirdTokenizer"):
        Tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerUnreadable, match="tokenizer.json"):
        Tokenizer(tmp_path)


def test_an_added_token_not_marked_special_is_text_when_specials_are_skipped(tmp_path: Path) -> None:
    """Qwen's <tool_call> is an added token with "special": false: a reply keeps it, as decode does,
    so tool calls written with it can be read back (service/front/tool_formats.py)."""
    write_byte_level_tokenizer(tmp_path, 512)
    doc = json.loads((tmp_path / "tokenizer.json").read_text())
    added = [("<tool_call>", False), ("<|tag|>", True)]
    free = len(doc["model"]["vocab"])  # past the vocabulary, as added tokens are
    doc["added_tokens"] += [
        {
            "id": free + i,
            "content": content,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": special,
        }
        for i, (content, special) in enumerate(added)
    ]
    (tmp_path / "tokenizer.json").write_text(json.dumps(doc))
    tok = Tokenizer(tmp_path)
    ids = tok.encode("<|tag|><tool_call>{}")
    assert ids[:2] == [free + 1, free]
    assert tok.decode(ids) == "<tool_call>{}"
    assert "".join(tok.stream(skip_special=True).pieces(ids)) == "<tool_call>{}"
