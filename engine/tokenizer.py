"""Text <-> token ids for a model directory, on onnxruntime-extensions' C++ tokenizer.

Owns: encoding and decoding (`pp_api.Tokenizer`, the tokenizer onnxruntime-genai
itself uses, so ids match the peer token for token), streaming decoding that
never splits a multi-byte UTF-8 character, and chat prompts from the model's own
template (engine/chat_template.py). A tokenizer class the C++ tokenizer does not
know is read under the generic class of its model type from a patched copy of
tokenizer_config.json; one it cannot read at all raises TokenizerUnreadable (the
server then serves token ids). Guarantees: the pieces a `StreamDecoder` yields
concatenate to `decode(ids, skip_special=False)`; no Rust-built dependency is involved.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog
from onnxruntime_extensions import pp_api

from engine.chat_messages import ChatMessage, FunctionTool
from engine.chat_template import ChatTemplate, TemplateUnusable, token_text
from engine.convert.tokenizer_json import bytes_to_unicode
from engine.errors import Unsupported

__all__ = ["ChatMessage", "StreamDecoder", "Tokenizer", "TokenizerUnreadable"]

log = structlog.get_logger("ladder.tokenizer")

# A class the C++ tokenizer does not know (transformers' "TokenizersBackend", a missing
# class) is read under the generic class of its tokenizer.json model type.
GENERIC_CLASS = {"BPE": "PreTrainedTokenizerFast", "Unigram": "XLMRobertaTokenizer"}


class TokenizerUnreadable(Exception):
    """The directory's tokenizer cannot be read: the server serves token ids only."""


class Tokenizer:
    """The tokenizer of one model directory (tokenizer.json + tokenizer_config.json)."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = Path(model_dir)
        doc = _read_json(self.model_dir / "tokenizer.json")
        config_path = self.model_dir / "tokenizer_config.json"
        config = _read_json(config_path) if config_path.exists() else {}
        try:
            self._token_bytes = _token_bytes(doc)
            vocab = _vocab(doc) | {t["content"]: t["id"] for t in doc.get("added_tokens", [])}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise TokenizerUnreadable(f"tokenizer.json has no vocabulary Ladder can read ({exc!r})") from exc
        self.special_ids = frozenset(t["id"] for t in doc.get("added_tokens", []))
        # What skip_special leaves out of text: added tokens marked special, as transformers and the C++
        # tokenizer's decode do; an added token that is not (Qwen's <tool_call>) is text.
        self.skipped_ids = frozenset(t["id"] for t in doc.get("added_tokens", []) if t.get("special", True))
        self.bos_token_id = vocab.get(token_text(config.get("bos_token")) or "")
        self.eos_token_id = vocab.get(token_text(config.get("eos_token")) or "")
        self.vocab_size = len(self._token_bytes)
        self.drops_leading_space = _drops_leading_space(doc)
        self.chat_template, self.chat_problem = _chat_template(self.model_dir, config)
        self._keep_special, self._skip_special = _open_native(self.model_dir, config, doc)

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        """Token ids of `text`; special tokens written out in it (`<|im_start|>`) become their id."""
        ids = [int(i) for i in self._skip_special.tokenize(text)]
        return [self.bos_token_id, *ids] if add_bos and self.bos_token_id is not None else ids

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

    def render_chat(
        self,
        messages: Iterable[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[FunctionTool] = (),
    ) -> str:
        """The prompt the model's own chat template makes of `messages` and `tools` (ChatML when it
        has none)."""
        if self.chat_template is None:
            raise Unsupported(
                f"the model's chat template cannot be used ({self.chat_problem}); "
                "send a text prompt with the turns written out"
            )
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools)

    def encode_chat(
        self,
        messages: Iterable[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        tools: Sequence[FunctionTool] = (),
    ) -> list[int]:
        text = self.render_chat(messages, add_generation_prompt=add_generation_prompt, tools=tools)
        ids = self.encode(text)
        # A tokenizer that adds BOS itself, under a template that writes it too: keep one.
        bos = self.bos_token_id
        return ids[1:] if bos is not None and ids[:2] == [bos, bos] else ids


def _read_json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TokenizerUnreadable(f"{path.name} cannot be read: {exc}") from exc
    if not isinstance(doc, dict):
        raise TokenizerUnreadable(f"{path.name} is not a JSON object")
    return doc


def _chat_template(model_dir: Path, config: Mapping[str, Any]) -> tuple[ChatTemplate | None, str]:
    """The compiled template, or None and why (the tokenizer still serves text prompts)."""
    try:
        return ChatTemplate.of(model_dir, config), ""
    except TemplateUnusable as exc:
        log.warning("chat_template_unusable", model=str(model_dir), reason=str(exc))
        return None, str(exc)


def _native_pair(path: Path) -> tuple[Any, Any]:
    """The C++ tokenizer twice: keeping special tokens when decoding, and skipping them."""
    return pp_api.Tokenizer(str(path), {"skip_special_tokens": "false"}), pp_api.Tokenizer(str(path))


def _open_native(model_dir: Path, config: Mapping[str, Any], doc: Mapping[str, Any]) -> tuple[Any, Any]:
    """The C++ tokenizer of `model_dir`; a class it does not know is read under the generic class
    of the same model type, from a patched copy of tokenizer_config.json (the user's stays as it is)."""
    try:
        return _native_pair(model_dir)
    except RuntimeError as exc:
        first = " ".join(str(exc).split())
    generic = GENERIC_CLASS.get(str(doc.get("model", {}).get("type")))
    declared = config.get("tokenizer_class")
    if generic is None or declared == generic:
        raise TokenizerUnreadable(f"onnxruntime-extensions cannot read it: {first}")
    with tempfile.TemporaryDirectory(prefix="ladder-tokenizer-") as copy:
        for entry in model_dir.iterdir():
            if entry.name != "tokenizer_config.json" and entry.is_file():
                (Path(copy) / entry.name).symlink_to(entry.resolve())
        patched = {**config, "tokenizer_class": generic}
        (Path(copy) / "tokenizer_config.json").write_text(json.dumps(patched), encoding="utf-8")
        try:
            pair = _native_pair(Path(copy))
        except RuntimeError as exc:
            raise TokenizerUnreadable(
                f"onnxruntime-extensions cannot read it ({first}), nor as "
                f"{generic}: {' '.join(str(exc).split())}"
            ) from exc
    log.info("tokenizer_class_read_as", model=str(model_dir), declared=declared, read_as=generic)
    return pair


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
        self._started = False

    def push(self, token_id: int) -> str:
        """The text that `token_id` completes ("" while a character is still partial)."""
        if self._skip_special and token_id in self._tokenizer.skipped_ids:
            return ""
        self._pending += self._tokenizer.token_bytes(token_id)
        cut = _complete_prefix_length(self._pending)
        text, self._pending = self._pending[:cut].decode("utf-8", "replace"), self._pending[cut:]
        return self._first(text)

    def _first(self, text: str) -> str:
        """A SentencePiece-style decoder drops the space its first word carries ("▁Paris")."""
        if not self._started and text:
            self._started = True
            if self._tokenizer.drops_leading_space and text.startswith(" "):
                return text[1:]
        return text

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character decodes as U+FFFD)."""
        text, self._pending = self._pending.decode("utf-8", "replace"), b""
        return self._first(text)

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


def _vocab(doc: Mapping[str, Any]) -> dict[str, int]:
    """The model's own vocabulary: BPE and WordPiece write a map, Unigram a list of [piece, score]."""
    vocab = doc["model"]["vocab"]
    if isinstance(vocab, list):
        return {str(entry[0]): i for i, entry in enumerate(vocab)}
    return {str(token): int(i) for token, i in vocab.items()}


def _is_byte_level(doc: Mapping[str, Any]) -> bool:
    decoder = doc.get("decoder") or {}
    parts = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    return not decoder or any(part.get("type") == "ByteLevel" for part in parts)


def _drops_leading_space(doc: Mapping[str, Any]) -> bool:
    """Whether decoding drops the space the first token's U+2581 stands for (Metaspace with a
    prepended space, or a Strip of one leading space)."""
    decoder = doc.get("decoder") or {}
    parts = decoder.get("decoders", [decoder]) if decoder.get("type") == "Sequence" else [decoder]
    for part in parts:
        if part.get("type") == "Metaspace":
            return bool(part.get("add_prefix_space", part.get("prepend_scheme", "always") != "never"))
        if part.get("type") == "Strip" and part.get("start", 0) >= 1:
            return True
    return False


def _piece_bytes(token: str) -> bytes:
    """A SentencePiece-style token's bytes: <0xNN> byte fallback, U+2581 for a space."""
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        return bytes([int(token[3:5], 16)])
    return token.replace("\u2581", " ").encode("utf-8")


def _token_bytes(doc: Mapping[str, Any]) -> list[bytes]:
    """Bytes for every id: byte-level tokens through GPT-2's map (SentencePiece-style ones
    through their byte fallback), added tokens as UTF-8."""
    vocab = _vocab(doc)
    added = doc.get("added_tokens", [])
    table = [b""] * (max([*vocab.values(), *(t["id"] for t in added)]) + 1)
    if _is_byte_level(doc):
        decode = {c: b for b, c in bytes_to_unicode().items()}
        for token, token_id in vocab.items():
            table[token_id] = bytes(decode.get(c, 0x3F) for c in token)
    else:
        for token, token_id in vocab.items():
            table[token_id] = _piece_bytes(token)
    for entry in added:
        table[entry["id"]] = entry["content"].encode("utf-8")
    return table
