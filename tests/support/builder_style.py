"""Model directories as onnxruntime-genai 0.18's model builder writes them for current models.

What sets them apart from Ladder's own generated directories: genai_config.json
declares no `search.chunk_size` (the builder writes one only with `--search`),
tokenizer_config.json names transformers' `TokenizersBackend` class, and the chat
template is the model's own (Llama 3's here), not ChatML. The decoder is the
seeded random GQA decoder of engine/modelgen, with Llama 3's special tokens in
its vocabulary.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

from engine.convert.tokenizer_json import synthetic_vocabulary, write_tokenizer_files
from engine.modelgen.synthetic import VARIANTS, build_synthetic

VOCAB = 1024
LLAMA3_SPECIALS = {
    "<|begin_of_text|>": 961,
    "<|end_of_text|>": 962,
    "<|start_header_id|>": 963,
    "<|end_header_id|>": 964,
    "<|eot_id|>": 965,
}
BOS, EOT = LLAMA3_SPECIALS["<|begin_of_text|>"], LLAMA3_SPECIALS["<|eot_id|>"]
LLAMA3_TEMPLATE = json.loads(
    (Path(__file__).parents[1] / "engine" / "data" / "chat_templates.json").read_text(encoding="utf-8")
)["models"]["Meta-Llama-3-8B-Instruct"]["template"]


def builder_style_model(
    root: Path, *, tokenizer_class: str = "TokenizersBackend", tokenizer_type: str = "BPE"
) -> Path:
    """A fresh builder-style directory under `root` (the decoder is shared, the files are not)."""
    spec = dataclasses.replace(VARIANTS["plain"], vocab_size=VOCAB)
    path = root / f"builder-{tokenizer_class}-{tokenizer_type}"
    if path.exists():
        return path
    shutil.copytree(build_synthetic(spec, root / "decoders"), path)
    _edit_json(path / "genai_config.json", _builder_genai_config)
    vocab = synthetic_vocabulary(VOCAB)
    tokens = list(vocab.tokens)
    for name, token_id in LLAMA3_SPECIALS.items():
        tokens[token_id] = name
    vocab = dataclasses.replace(
        vocab,
        tokens=tokens,
        bos_token_id=BOS,
        eos_token_id=EOT,
        chat_template=LLAMA3_TEMPLATE,
        extra_config={"tokenizer_class": tokenizer_class},
    )
    write_tokenizer_files(path, vocab)
    if tokenizer_type != "BPE":  # a model type onnxruntime-extensions has no reader for
        _edit_json(path / "tokenizer.json", lambda doc: doc["model"].update(type=tokenizer_type))
    return path


def _builder_genai_config(config: dict[str, Any]) -> None:
    del config["search"]["chunk_size"]
    config["model"].update(bos_token_id=BOS, eos_token_id=[LLAMA3_SPECIALS["<|end_of_text|>"], EOT])


def _edit_json(path: Path, edit: Any) -> None:
    doc = json.loads(path.read_text(encoding="utf-8"))
    edit(doc)
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
