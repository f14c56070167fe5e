"""The lm-head of a decoder graph: finding it, and gathering the rows that are read before it.

A prefill forward reads one row of logits (its last real row) but an unchanged
graph computes the head for every query row, padded ones included: for a
49152-token vocabulary that is 100 MB of fp32 logits and a fifth of the
arithmetic at 512 rows. `gather_read_rows` rewrites a graph so the head runs
only on the rows named by an index input:

    logits_rows  [read_rows] int64    which query rows reach the head (clamped to the rows there are);
                                      not fed (empty, its default): every row, as before, so
                                      onnxruntime-genai runs the rewritten graph unchanged
    logits       [batch, read_rows, vocab]
    logits_rows_seen [read_rows + 1]  the head-input row each logits row came from, then the last
                                      row the head's input had: what the engine's self-check reads

The gather sits right before the head (after the final norm): the head is the
MatMul / Gemm / MatMulNBits the `logits` output comes from through reshapes,
casts and a bias. A graph whose head cannot be found this way, or whose logits
are not one row per query row, is left as it is (`CannotRewrite`).

`prepared_graph` applies it to a model directory Ladder does not own: the
rewritten copy lives in Ladder's cache (the user's files are never edited),
keyed by the source file's path, size and modification time; external weights
are not copied, onnxruntime reads them from the model directory.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import structlog
from onnx import helper, numpy_helper

from engine.model import READ_ROWS_DIM, READ_ROWS_INPUT, SEEN_OUTPUT, ModelInfo, load_model_info

log = structlog.get_logger("ladder.engine")

REWRITE_VERSION = 2  # bump when the rewrite's output changes: cached copies are then made again
HEAD_OPS = {"MatMul", "Gemm", "MatMulNBits"}
EXTERNAL_MARKER = "weights_in_model_dir"  # in a cached copy whose weights stay in the model directory
SOURCE_MARKER = "made_from"  # in every cached copy: the source graph's path and the rewrite
ROW_KEEPING = {"Identity", "Cast"}  # ops that keep every element where it is


class CannotRewrite(ValueError):
    """The graph's head cannot be found, or its logits are not one row per query row."""


@dataclass(frozen=True)
class HeadSite:
    head: onnx.NodeProto  # the node computing the logits' scores
    hidden: str  # the tensor [batch, rows, hidden] the head's input is taken from


class _Graph:
    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.producer = {out: n for n in graph.node for out in n.output}
        # Small constants only (shapes, axes, biases' presence): weights are never read.
        self.consts = {
            t.name: numpy_helper.to_array(t)
            for t in graph.initializer
            if t.data_location != onnx.TensorProto.EXTERNAL and int(np.prod(t.dims)) <= 16
        }
        self.consts.update({t.name: np.zeros(0) for t in graph.initializer if t.name not in self.consts})
        for node in graph.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                self.consts[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        self.consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)

    def reaches(self, node: onnx.NodeProto) -> set[str]:
        """The graph outputs `node`'s results flow into."""
        outputs = {o.name for o in self.graph.output}
        found: set[str] = set()
        todo, seen = [node], set()
        while todo:
            current = todo.pop()
            for name in current.output:
                found |= {name} & outputs
                for consumer in self.consumers.get(name, ()):
                    if id(consumer) not in seen:
                        seen.add(id(consumer))
                        todo.append(consumer)
        return found


def _flattens_rows(g: _Graph, node: onnx.NodeProto) -> bool:
    """A Reshape to [-1, hidden]: rows of every batch stacked, each row intact."""
    shape = g.consts.get(node.input[1]) if len(node.input) > 1 else None
    return shape is not None and shape.ndim == 1 and len(shape) == 2 and int(shape[0]) == -1


def _after_head(g: _Graph, node: onnx.NodeProto) -> bool:
    """Ops between the head and `logits` that keep one row per row the head computed."""
    if node.op_type in ROW_KEEPING:
        return True
    if node.op_type == "Add":  # a bias
        return any(name in g.consts for name in node.input)
    if node.op_type == "Reshape":  # back to [batch, rows, vocab]: a computed shape, or [.., -1, ..]
        shape = g.consts.get(node.input[1])
        return shape is None or (len(shape) == 3 and int(shape[1]) in (-1, 0) and int(shape[0]) != -1)
    return False


def find_head(model: onnx.ModelProto) -> HeadSite:
    """The head and the hidden tensor it reads; raises CannotRewrite with the reason."""
    graph = model.graph
    g = _Graph(graph)
    logits = next((o for o in graph.output if o.name == "logits"), None)
    feed = next((i for i in graph.input if i.name in ("input_ids", "inputs_embeds")), None)
    if logits is None or feed is None or "logits" not in g.producer:
        raise CannotRewrite("no logits output computed from input_ids or inputs_embeds")
    rows, query = (v.type.tensor_type.shape.dim[1] for v in (logits, feed))
    if not rows.dim_param or rows.dim_param != query.dim_param:
        raise CannotRewrite("logits are not declared one row per query row")
    node = g.producer["logits"]
    while _after_head(g, node):
        node = g.producer.get(_data_input(g, node), node)
    if node.op_type not in HEAD_OPS or (node.op_type == "Gemm" and _attr(node, "transA")):
        raise CannotRewrite(f"logits come from {node.op_type}, not a MatMul/Gemm/MatMulNBits head")
    hidden = node.input[0]
    while (up := g.producer.get(hidden)) is not None and (
        up.op_type in ROW_KEEPING or (up.op_type == "Reshape" and _flattens_rows(g, up))
    ):
        hidden = up.input[0]
    return HeadSite(node, hidden)


def _data_input(g: _Graph, node: onnx.NodeProto) -> str:
    """The input that carries the rows (for a bias Add: the one that is not a constant)."""
    return next((n for n in node.input if n not in g.consts), node.input[0])


def _attr(node: onnx.NodeProto, name: str) -> int:
    return next((int(a.i) for a in node.attribute if a.name == name), 0)


def gather_read_rows(model: onnx.ModelProto, on_device: bool = False) -> onnx.ModelProto:
    """`model` with the head fed only the query rows `logits_rows` names (edited in place).

    `on_device`: the form a CUDA graph can capture (`_device_read_rows_nodes`); `logits_rows`
    must then always be fed."""
    graph = model.graph
    if any(i.name == READ_ROWS_INPUT for i in graph.input):
        return model
    site = find_head(model)
    g = _Graph(graph)
    head_path = [c for c in g.consumers.get(site.hidden, []) if g.reaches(c) == {"logits"}]
    if not head_path:
        raise CannotRewrite("the head's input also feeds other outputs")
    read = f"{site.hidden}.read_rows"
    for node in head_path:
        node.input[:] = [read if name == site.hidden else name for name in node.input]
    _check_head_reads(graph, site, read)
    new = (_device_read_rows_nodes if on_device else _read_rows_nodes)(graph, site.hidden, read)
    at = min(i for i, n in enumerate(graph.node) if n in head_path)
    for offset, node in enumerate(new):
        graph.node.insert(at + offset, node)
    if not on_device:  # an input with a default (an initializer of the same name): empty unless fed
        graph.initializer.append(numpy_helper.from_array(np.zeros(0, np.int64), READ_ROWS_INPUT))
    int64 = onnx.TensorProto.INT64
    graph.input.append(helper.make_tensor_value_info(READ_ROWS_INPUT, int64, [READ_ROWS_DIM]))
    graph.output.append(helper.make_tensor_value_info(SEEN_OUTPUT, int64, [f"{READ_ROWS_DIM}_and_1"]))
    logits = next(o for o in graph.output if o.name == "logits")
    logits.type.tensor_type.shape.dim[1].dim_param = READ_ROWS_DIM
    # Shapes recorded for the head's tensors described every query row: no longer true.
    downstream = {out for n in head_path for out in n.output}
    kept = [v for v in graph.value_info if v.name not in downstream]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    return model


def _read_rows_nodes(graph: onnx.GraphProto, hidden: str, read: str) -> list[onnx.NodeProto]:
    """hidden [batch, rows, h] -> read [batch, read_rows, h], and the rows seen.

    Row counts are shape arithmetic (onnxruntime keeps it on the host); the row numbers and
    the gather run on the device, so a captured CUDA graph writes them on every replay."""
    p = "read_rows"
    inits = {
        f"{p}.axis": np.array(1, np.int64),
        f"{p}.zero": np.array(0, np.int64),
        f"{p}.one": np.array(1, np.int64),
        f"{p}.last": np.array([-1], np.int64),
        f"{p}.start": np.array([0], np.int64),
        f"{p}.axes": np.array([0], np.int64),
    }
    graph.initializer.extend(numpy_helper.from_array(v, n) for n, v in inits.items())
    node = _node
    return [
        node("Shape", [hidden], f"{p}.shape"),
        node("Gather", [f"{p}.shape", f"{p}.axis"], f"{p}.count", axis=0),
        node("Range", [f"{p}.zero", f"{p}.count", f"{p}.one"], f"{p}.every"),
        node("Gather", [f"{p}.every", f"{p}.last"], f"{p}.max", axis=0),
        # Rows named, else (none fed) every row: the first `named or count` of named + every.
        node("Size", [READ_ROWS_INPUT], f"{p}.named"),
        node("Equal", [f"{p}.named", f"{p}.zero"], f"{p}.none"),
        node("Cast", [f"{p}.none"], f"{p}.none_i64", to=onnx.TensorProto.INT64),
        node("Mul", [f"{p}.none_i64", f"{p}.count"], f"{p}.fill"),
        node("Add", [f"{p}.named", f"{p}.fill"], f"{p}.taken"),
        node("Unsqueeze", [f"{p}.taken", f"{p}.axes"], f"{p}.stop"),
        node("Concat", [READ_ROWS_INPUT, f"{p}.every"], f"{p}.candidates", axis=0),
        node("Slice", [f"{p}.candidates", f"{p}.start", f"{p}.stop", f"{p}.axes"], f"{p}.wanted"),
        *_gather_rows(hidden, read, f"{p}.wanted", f"{p}.max"),
    ]


def _node(op: str, inputs: list[str], output: str, **attrs: Any) -> onnx.NodeProto:
    return helper.make_node(op, inputs, [output], name=output, **attrs)


def _gather_rows(hidden: str, read: str, wanted: str, last: str) -> list[onnx.NodeProto]:
    """The rows `wanted` names, clamped to the `last` row there is, gathered into `read`; the rows
    seen (the clamped numbers, then `last`). Clamped: a graph that contracted the query axis upstream
    runs on, and the self-check sees it."""
    index = "read_rows.index"
    return [
        _node("Min", [wanted, last], index),
        _node("Gather", [hidden, index], read, axis=1),
        _node("Concat", [index, last], SEEN_OUTPUT, axis=0),
    ]


def _device_read_rows_nodes(graph: onnx.GraphProto, hidden: str, read: str) -> list[onnx.NodeProto]:
    """What `_read_rows_nodes` computes for a fed `logits_rows`, in a form a CUDA graph captures:
    every op runs on the device but Shape, whose host output only ConstantOfShape reads (as a
    shape, which needs no copy). The row count is counted on the device: the sum of a row of
    ones as long as the query axis. No default: the CUDA backend always feeds the row numbers."""
    p = "read_rows"
    graph.initializer.extend([numpy_helper.from_array(np.array([1], np.int64), f"{p}.one")])
    node, one = _node, numpy_helper.from_array(np.array([1.0], np.float32))
    return [
        node("Shape", [hidden], f"{p}.rows_shape", start=1, end=2),
        node("ConstantOfShape", [f"{p}.rows_shape"], f"{p}.ones", value=one),
        node("ReduceSum", [f"{p}.ones"], f"{p}.count_f", keepdims=1),
        node("Cast", [f"{p}.count_f"], f"{p}.count", to=onnx.TensorProto.INT64),
        node("Sub", [f"{p}.count", f"{p}.one"], f"{p}.max"),
        *_gather_rows(hidden, read, READ_ROWS_INPUT, f"{p}.max"),
    ]


def gather_read_rows_on_device(model: onnx.ModelProto) -> onnx.ModelProto:
    """The CUDA backend's graph: the head on the rows `logits_rows` names, by a gather a CUDA graph
    captures (a host-side gather already there is taken out first)."""
    return gather_read_rows(every_row_head(model), on_device=True)


def every_row_head(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with the gather `gather_read_rows` put before the head taken out again (edited in
    place): the head runs on every query row and there is no `logits_rows` input.

    The CUDA backend cannot run the host-side gather: its row arithmetic (Shape, Range, Concat
    over the fed indices) is split by onnxruntime between host and device, and the copies between
    them are not allowed while a CUDA graph is captured (seen on the H200: "operation failed due
    to a previous error during capture"). It runs `gather_read_rows_on_device` instead, or this
    for a graph declared read-only."""
    graph = model.graph
    if not any(i.name == READ_ROWS_INPUT for i in graph.input):
        return model

    def added(name: str) -> bool:  # what `_read_rows_nodes` writes
        return name.startswith("read_rows.") or name.endswith(".read_rows") or name == SEEN_OUTPUT

    ours = [n for n in graph.node if added(n.output[0])]
    gather = next(n for n in ours if n.op_type == "Gather" and n.output[0].endswith(".read_rows"))
    read, hidden = gather.output[0], gather.input[0]
    for node in ours:
        graph.node.remove(node)
    for node in graph.node:
        node.input[:] = [hidden if name == read else name for name in node.input]
    for name, items in ((READ_ROWS_INPUT, graph.input), (SEEN_OUTPUT, graph.output)):
        for item in [v for v in items if v.name == name]:
            items.remove(item)
    for init in [t for t in graph.initializer if t.name == READ_ROWS_INPUT or added(t.name)]:
        graph.initializer.remove(init)
    feed = next(i for i in graph.input if i.name in ("input_ids", "inputs_embeds"))
    logits = next(o for o in graph.output if o.name == "logits")
    logits.type.tensor_type.shape.dim[1].dim_param = feed.type.tensor_type.shape.dim[1].dim_param
    return model


def _check_head_reads(graph: onnx.GraphProto, site: HeadSite, read: str) -> None:
    """After rewiring, the head's input must come from the gathered rows."""
    producer = {out: n for n in graph.node for out in n.output}
    name = site.head.input[0]
    while name != read and (up := producer.get(name)) is not None and up.op_type in {*ROW_KEEPING, "Reshape"}:
        name = up.input[0]
    if name != read:
        raise CannotRewrite("the head's input does not come only from the hidden rows")


# -- a rewritten copy of a model directory's graph, kept in Ladder's cache ----------------------
def prepared_graph(
    info: ModelInfo, cache: Path, read_only: bool = False, on_device: bool = False
) -> ModelInfo:
    """`info` for the graph Ladder runs: the head on read rows only where it can be, else as it is.

    `on_device` (the CUDA backend): the gather in the form a CUDA graph captures; a read-only
    graph that gathers on the host loses its gather (`every_row_head`)."""
    if read_only:
        rewrite = every_row_head if on_device and info.logits_rows else None
    elif on_device:
        rewrite = gather_read_rows_on_device
    else:
        rewrite = None if info.logits_rows else gather_read_rows
    if rewrite is None:
        return info
    try:
        graph, external = _cached_copy(info.graph, cache, rewrite)
    except CannotRewrite as exc:
        log.info("head_on_every_row", model=str(info.path), reason=str(exc))
        return info
    except OSError as exc:
        log.warning("head_on_every_row", model=str(info.path), reason=f"graph cache: {exc}")
        return info
    # External weights stay where they are: onnxruntime is told to read them there.
    return replace(load_model_info(info.path, graph), weights_dir=info.graph.parent if external else None)


def _key(source: Path, rewrite: Callable[[onnx.ModelProto], onnx.ModelProto]) -> str:
    stat = source.stat()
    text = f"{source.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{REWRITE_VERSION}|{rewrite.__name__}"
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _cached_copy(
    source: Path, cache: Path, rewrite: Callable[[onnx.ModelProto], onnx.ModelProto]
) -> tuple[Path, bool]:
    """The rewritten graph file, and whether its weights are external (left beside the source)."""
    target = cache / _key(source, rewrite)
    graph, marker = target / source.name, target / EXTERNAL_MARKER
    if graph.exists():
        return graph, marker.exists()
    model = onnx.load(str(source), load_external_data=False)
    rewrite(model)
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".rewrite.", dir=cache))
    made_from = f"{source.resolve()}\n{rewrite.__name__}\n"
    try:
        onnx.save_model(model, str(staging / source.name))
        if _has_external_data(model):
            (staging / EXTERNAL_MARKER).write_text(f"{source.parent}\n")
        (staging / SOURCE_MARKER).write_text(made_from)
        staging.replace(target)
    except OSError:
        if not graph.exists():
            raise  # else another process made it first: the same content
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("head_rewritten", rewrite=rewrite.__name__, source=str(source), graph=str(graph))
    _drop_stale_copies(cache, target, made_from)
    return graph, marker.exists()


def _drop_stale_copies(cache: Path, kept: Path, made_from: str) -> None:
    """Remove the copies an earlier version of the same source graph left (same path and rewrite,
    another size, time or rewrite version): the cache holds one copy per source, not one per edit.
    A process still running an old copy is unaffected: onnxruntime read it when it loaded."""
    for copy in cache.iterdir():
        marker = copy / SOURCE_MARKER
        if copy != kept and marker.is_file() and marker.read_text() == made_from:
            shutil.rmtree(copy, ignore_errors=True)
            log.info("graph_copy_dropped", graph=str(copy), reason="its source graph changed")


def _has_external_data(model: onnx.ModelProto) -> bool:
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
