"""Hugging Face-format tokenizer files (tokenizer.json, tokenizer_config.json) for byte-level BPE.

Two sources: the GPT-2 style vocabulary and merges a GGUF carries (the real
model), and a generated tiny byte-level vocabulary for the synthetic test
models. Both are written so that onnxruntime-extensions' C++ tokenizer
(`pp_api.Tokenizer`) and onnxruntime-genai load them unchanged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class BpeVocabulary:
    """A byte-level BPE vocabulary: tokens in id order, merges in rank order."""

    tokens: list[str]
    merges: list[str]
    special_ids: list[int]
    bos_token_id: int
    eos_token_id: int
    unk_token_id: int
    pad_token_id: int
    chat_template: str
    split_digits: bool = False
    extra_config: dict[str, Any] = field(default_factory=dict)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable code points."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def _pre_tokenizer(split_digits: bool) -> dict[str, Any]:
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    if not split_digits:
        return byte_level
    # SmolLM's pre-tokenizer ("smollm" in GGUF): every digit stands alone before the byte split.
    return {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, byte_level]}


def _added_token(token_id: int, content: str) -> dict[str, Any]:
    return {
        "id": token_id,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    }


def tokenizer_json(vocab: BpeVocabulary) -> dict[str, Any]:
    """The tokenizer.json document for `vocab`."""
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [_added_token(i, vocab.tokens[i]) for i in vocab.special_ids],
        "normalizer": None,
        "pre_tokenizer": _pre_tokenizer(vocab.split_digits),
        "post_processor": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": True,
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {tok: i for i, tok in enumerate(vocab.tokens)},
            "merges": vocab.merges,
        },
    }


def tokenizer_config(vocab: BpeVocabulary) -> dict[str, Any]:
    """The tokenizer_config.json document for `vocab` (no BOS added: ChatML carries its own)."""
    t = vocab.tokens
    return {
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(i): {k: v for k, v in _added_token(i, t[i]).items() if k != "id"} for i in vocab.special_ids
        },
        "additional_special_tokens": [t[i] for i in vocab.special_ids],
        "bos_token": t[vocab.bos_token_id],
        "eos_token": t[vocab.eos_token_id],
        "unk_token": t[vocab.unk_token_id],
        "pad_token": t[vocab.pad_token_id],
        "chat_template": vocab.chat_template,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 8192,
        "tokenizer_class": "GPT2Tokenizer",
        "vocab_size": len(t),
        **vocab.extra_config,
    }


def write_tokenizer_files(model_dir: Path, vocab: BpeVocabulary) -> list[Path]:
    """Write tokenizer.json and tokenizer_config.json into `model_dir`; return their paths."""
    model_dir.mkdir(parents=True, exist_ok=True)
    paths = [model_dir / "tokenizer.json", model_dir / "tokenizer_config.json"]
    for path, doc in zip(paths, (tokenizer_json(vocab), tokenizer_config(vocab)), strict=True):
        path.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return paths


SYNTHETIC_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _synthetic_merges(byte_chars: list[str], budget: int) -> tuple[list[str], list[str]]:
    """Merges of common ASCII pairs (space + letter, then letter pairs) up to `budget` tokens."""
    enc = bytes_to_unicode()
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    pairs = [(enc[ord(" ")], enc[ord(c)]) for c in letters]
    pairs += [(enc[ord(a)], enc[ord(b)]) for a in letters for b in letters]
    pairs = pairs[: max(budget, 0)]
    return [a + b for a, b in pairs], [f"{a} {b}" for a, b in pairs]


def synthetic_vocabulary(vocab_size: int) -> BpeVocabulary:
    """Specials at ids 0-2, the 256 byte tokens after them, then merges up to `vocab_size`.

    Past the 702 ASCII pair merges the remaining ids are reserved special
    tokens (`<|reserved_N|>`), so every id below `vocab_size` decodes.
    """
    if vocab_size < len(SYNTHETIC_SPECIALS) + 256:
        raise ValueError(f"a byte-level vocabulary needs at least 259 ids, got {vocab_size}")
    enc = bytes_to_unicode()
    byte_chars = [enc[b] for b in range(256)]
    merged, merges = _synthetic_merges(byte_chars, vocab_size - len(SYNTHETIC_SPECIALS) - 256)
    tokens = SYNTHETIC_SPECIALS + byte_chars + merged
    reserved = [f"<|reserved_{i}|>" for i in range(vocab_size - len(tokens))]
    specials = [0, 1, 2, *range(len(tokens), vocab_size)]
    return BpeVocabulary(
        tokens=tokens + reserved,
        merges=merges,
        special_ids=specials,
        bos_token_id=1,
        eos_token_id=2,
        unk_token_id=0,
        pad_token_id=0,
        chat_template=CHATML_TEMPLATE,
    )


def write_byte_level_tokenizer(model_dir: Path, vocab_size: int) -> list[Path]:
    """A tiny byte-level BPE tokenizer for a generated model of `vocab_size` ids.

    Ids: 0 <|endoftext|>, 1 <|im_start|> (bos), 2 <|im_end|> (eos), 3..258 the
    bytes 0..255, then merges of common ASCII pairs (and reserved specials past
    those) until the vocabulary is full.
    Any text encodes (every byte has a token) and every id below `vocab_size` decodes.
    """
    return write_tokenizer_files(model_dir, synthetic_vocabulary(vocab_size))
