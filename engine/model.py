"""Loading a model directory in the onnxruntime-genai layout into plain facts.

Reads `genai_config.json`, the optional `inference_metadata.yaml` (its
`runtime_configurable.chunked_prefill.chunk_size` wins over `search.chunk_size`),
and the graph's own ports and shapes: names, KV layout, per-token ports,
recurrent state, and how many rows the rotary caches hold. Shapes come from
the model, never from assumption.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import yaml

from engine.errors import ModelUnreadable

KV_NAME = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
# A graph whose head runs only on the rows read (engine/head.py): its index input, the symbol of
# the logits' row axis, and the output that says which rows the head saw.
READ_ROWS_INPUT = "logits_rows"
READ_ROWS_DIM = "read_rows"
SEEN_OUTPUT = "logits_rows_seen"
_ONNX_TO_NUMPY = {1: "float32", 10: "float16", 16: "bfloat16", 7: "int64", 6: "int32"}


@dataclass(frozen=True)
class Port:
    name: str
    dims: tuple[int | str, ...]
    dtype: str


@dataclass(frozen=True)
class ModelInfo:
    path: Path
    feed: Port  # input_ids or inputs_embeds
    mask: str
    kv_inputs: tuple[tuple[str, str], ...]  # (key, value) input names per layer
    kv_outputs: tuple[tuple[str, str], ...]
    kv_dtype: str
    num_kv_heads: int
    head_size: int
    logits: Port
    vocab_size: int
    supplied_ports: tuple[Port, ...]  # inputs the caller supplies besides the feed
    state_ports: tuple[tuple[Port, str], ...]  # recurrent state input and its output name
    position_ids: str | None
    chunk_size: int | None  # declared by the model; None: it declares none
    max_length: int
    rotary_rows: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    config: dict[str, Any]
    graph: Path  # the ONNX file onnxruntime loads (a rewritten copy in Ladder's cache, or the model's own)
    logits_rows: str | None = None  # the index input naming the query rows the head reads (None: every row)
    weights_dir: Path | None = None  # where `graph`'s external data lies if not beside it (a rewritten copy)

    @property
    def recurrent_state(self) -> bool:
        return bool(self.state_ports)

    @property
    def num_layers(self) -> int:
        return len(self.kv_inputs)


def _port(value: onnx.ValueInfoProto) -> Port:
    t = value.type.tensor_type
    dims = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in t.shape.dim)
    return Port(value.name, dims, _ONNX_TO_NUMPY.get(t.elem_type, str(t.elem_type)))


def _chunk_size(path: Path, config: dict[str, Any]) -> int | None:
    """The chunk width the model declares (None: it declares none)."""
    meta = path / "inference_metadata.yaml"
    if meta.exists():
        data = yaml.safe_load(meta.read_text()) or {}
        size = (data.get("runtime_configurable", {}) or {}).get("chunked_prefill", {}) or {}
        if "chunk_size" in size:
            return int(size["chunk_size"])
    size = config.get("search", {}).get("chunk_size")
    return None if size is None else int(size)


def _rotary_rows(graph: onnx.GraphProto) -> int:
    """Rows of the cos cache of the first rotary GroupQueryAttention (0 if none is found)."""
    inits = {t.name: t for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "GroupQueryAttention" and len(node.input) > 7:
            cos = inits.get(node.input[7])
            if cos is not None:
                return int(cos.dims[0])
    return 0


def _missing_key(config: dict[str, Any]) -> str:
    """The first key genai_config.json must have and does not ("" when it has them all)."""
    model = config.get("model")
    if not isinstance(model, dict):
        return "'model' object"
    if not isinstance(model.get("decoder"), dict):
        return "'model.decoder' object"
    return ""


def _eos(config: dict[str, Any]) -> tuple[int, ...]:
    eos = config["model"].get("eos_token_id", ())
    return tuple(eos) if isinstance(eos, list) else (int(eos),)


GRAPH_FILE = "model.onnx"  # the decoder graph when genai_config.json names none, and what Ladder writes


def decoder_file(path: Path, config: dict[str, Any]) -> Path:
    """The decoder graph of the model directory `path`: genai_config.json's model.decoder.filename."""
    return path / config["model"]["decoder"].get("filename", GRAPH_FILE)


def load_model_info(path: Path, graph_file: Path | None = None) -> ModelInfo:
    """Inspect a model directory (its graph, or `graph_file` in its place); raises ModelUnreadable when
    it is not a decoder we can run."""
    config_path = path / "genai_config.json"
    if not config_path.exists():
        raise ModelUnreadable(f"{path} has no genai_config.json")
    config = json.loads(config_path.read_text())
    missing = _missing_key(config)
    if missing:
        raise ModelUnreadable(f"{config_path} has no {missing}: it is not an onnxruntime-genai model config")
    decoder = config["model"]["decoder"]
    graph_file = graph_file or decoder_file(path, config)
    graph = onnx.load(str(graph_file), load_external_data=False).graph
    inputs = {v.name: _port(v) for v in graph.input if v.name not in {i.name for i in graph.initializer}}
    outputs = {v.name: _port(v) for v in graph.output}
    feed = inputs.get("input_ids") or inputs.get("inputs_embeds")
    if feed is None or "attention_mask" not in inputs or "logits" not in outputs:
        raise ModelUnreadable(f"{path}: needs input_ids or inputs_embeds, attention_mask, logits")
    layers = sorted({int(m.group(1)) for n in inputs if (m := KV_NAME.match(n))})
    kv_in = tuple((f"past_key_values.{i}.key", f"past_key_values.{i}.value") for i in layers)
    kv_out = tuple((f"present.{i}.key", f"present.{i}.value") for i in layers)
    known = {feed.name, "attention_mask", "position_ids", READ_ROWS_INPUT} | {n for kv in kv_in for n in kv}
    states = tuple(
        (p, p.name.replace("past", "present", 1))
        for n, p in inputs.items()
        if n not in known and n.startswith("past")
    )
    supplied = tuple(p for n, p in inputs.items() if n not in known and not n.startswith("past"))
    kv = inputs[kv_in[0][0]]
    logits = outputs["logits"]
    search = config.get("search", {})
    return ModelInfo(
        path=path,
        feed=feed,
        mask="attention_mask",
        kv_inputs=kv_in,
        kv_outputs=kv_out,
        kv_dtype=kv.dtype,
        num_kv_heads=int(kv.dims[1]) if isinstance(kv.dims[1], int) else int(decoder["num_key_value_heads"]),
        head_size=int(kv.dims[3]) if isinstance(kv.dims[3], int) else int(decoder["head_size"]),
        logits=logits,
        vocab_size=int(logits.dims[-1])
        if isinstance(logits.dims[-1], int)
        else int(config["model"]["vocab_size"]),
        supplied_ports=supplied,
        state_ports=states,
        position_ids="position_ids" if "position_ids" in inputs else None,
        chunk_size=_chunk_size(path, config),
        max_length=int(search.get("max_length") or config["model"].get("context_length", 0)),
        rotary_rows=_rotary_rows(graph),
        eos_token_ids=_eos(config),
        bos_token_id=config["model"].get("bos_token_id"),
        config=config,
        graph=graph_file,
        logits_rows=READ_ROWS_INPUT if any(v.name == READ_ROWS_INPUT for v in graph.input) else None,
    )
