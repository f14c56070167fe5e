"""Converters from published checkpoints into Ladder model directories.

`gguf_llama` reads a llama-architecture GGUF into the builder's spec and
weights; `tokenizer_json` writes the byte-level BPE tokenizer files that
onnxruntime-extensions loads.
"""
