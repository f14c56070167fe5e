"""Text <-> token ids for a model directory, on onnxruntime-extensions' C++ tokenizer.

Owns: encoding and decoding (`pp_api.Tokenizer`, the tokenizer onnxruntime-genai
itself uses, so ids match the peer token for token), streaming decoding that
never splits a multi-byte UTF-8 character, and ChatML prompts rendered in
Python. Guarantees: the pieces a `StreamDecoder` yields concatenate to
`decode(ids, skip_special=False)`; no Rust-built dependency is involved.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnxruntime_extensions import pp_api

from engine.convert.tokenizer_json import bytes_to_unicode

_DEFAULT_SYSTEM = re.compile(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", re.DOTALL)


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str


class Tokenizer:
    """The tokenizer of one model directory (tokenizer.json + tokenizer_config.json)."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = Path(model_dir)
        doc = json.loads((self.model_dir / "tokenizer.json").read_text(encoding="utf-8"))
        config = json.loads((self.model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
        self._token_bytes = _token_bytes(doc)
        self.special_ids = frozenset(t["id"] for t in doc.get("added_tokens", []))
        vocab: dict[str, int] = doc["model"]["vocab"]
        self.bos_token_id = vocab[config["bos_token"]]
        self.eos_token_id = vocab[config["eos_token"]]
        self.vocab_size = len(self._token_bytes)
        self.chat_template: str = config.get("chat_template") or ""
        match = _DEFAULT_SYSTEM.search(self.chat_template.replace("\\n", "\n"))
        self.default_system_prompt: str | None = match.group(1) if match else None
        options = {"skip_special_tokens": "false"}
        self._keep_special = pp_api.Tokenizer(str(self.model_dir), options)
        self._skip_special = pp_api.Tokenizer(str(self.model_dir))

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        """Token ids of `text`; special tokens written out in it (`<|im_start|>`) become their id."""
        ids = [int(i) for i in self._skip_special.tokenize(text)]
        return [self.bos_token_id, *ids] if add_bos else ids

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        """The text of `ids` (special tokens dropped unless `skip_special` is False)."""
        if not ids:
            return ""
        tok = self._skip_special if skip_special else self._keep_special
        return str(tok.detokenize([int(i) for i in ids])[0])

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes one token stands for (a special token: its UTF-8 name)."""
        return self._token_bytes[token_id]

    def stream(self, *, skip_special: bool = False) -> StreamDecoder:
        """A fresh incremental decoder for one generation."""
        return StreamDecoder(self, skip_special=skip_special)

    def render_chat(self, messages: Iterable[ChatMessage], *, add_generation_prompt: bool = True,
                    use_default_system: bool = True) -> str:
        """The ChatML prompt the model's template makes of `messages`.

        As the SmolLM2 template does, a conversation that does not open with a
        system turn gets the template's default system prompt, unless
        `use_default_system` is False.
        """
        turns = list(messages)
        opens_with_system = bool(turns) and turns[0].role == "system"
        if use_default_system and not opens_with_system and self.default_system_prompt:
            turns.insert(0, ChatMessage("system", self.default_system_prompt))
        text = "".join(f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in turns)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")

    def encode_chat(self, messages: Iterable[ChatMessage], *, add_generation_prompt: bool = True,
                    use_default_system: bool = True) -> list[int]:
        return self.encode(self.render_chat(messages, add_generation_prompt=add_generation_prompt,
                                            use_default_system=use_default_system))


class StreamDecoder:
    """Turns generated ids into text pieces as they come, one call per token.

    Bytes of a UTF-8 character split across tokens are held back until the
    character is complete, so no piece ever carries a replacement character
    that the full decode would not.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = False) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._pending = b""

    def push(self, token_id: int) -> str:
        """The text that `token_id` completes ("" while a character is still partial)."""
        if self._skip_special and token_id in self._tokenizer.special_ids:
            return ""
        self._pending += self._tokenizer.token_bytes(token_id)
        cut = _complete_prefix_length(self._pending)
        text, self._pending = self._pending[:cut].decode("utf-8", "replace"), self._pending[cut:]
        return text

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character decodes as U+FFFD)."""
        text, self._pending = self._pending.decode("utf-8", "replace"), b""
        return text

    def pieces(self, ids: Iterable[int]) -> Iterator[str]:
        for token_id in ids:
            if piece := self.push(token_id):
                yield piece
        if tail := self.flush():
            yield tail


def _complete_prefix_length(data: bytes) -> int:
    """Length of `data` without a trailing, still incomplete UTF-8 sequence."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:  # a lead byte (or ASCII): does its sequence fit?
            need = 1 if byte < 0x80 else 2 if byte >> 5 == 6 else 3 if byte >> 4 == 14 else 4
            return len(data) if need <= back or byte >> 3 == 0x1F else len(data) - back
    return len(data)


def _token_bytes(doc: dict[str, Any]) -> list[bytes]:
    """Bytes for every id: byte-level tokens through GPT-2's map, added tokens as UTF-8."""
    decode = {c: b for b, c in bytes_to_unicode().items()}
    vocab: dict[str, int] = doc["model"]["vocab"]
    table = [b""] * (max(vocab.values()) + 1)
    for token, token_id in vocab.items():
        table[token_id] = bytes(decode.get(c, 0x3F) for c in token)
    for added in doc.get("added_tokens", []):
        table[added["id"]] = added["content"].encode("utf-8")
    return table
