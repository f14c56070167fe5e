"""The lm-head runs only on the rows that are read: the last real row of a prefill forward.

A generated decoder carries the `logits_rows` index input; a model directory
without it is rewritten into Ladder's cache (never edited); a read-only or
unrewritable graph keeps its head on every row. The logits-row self-check
still guards every padded forward.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from engine.executor import EngineOptions
from engine.executor.engine import Engine
from engine.executor.prefill import read_index
from engine.head import CannotRewrite, find_head, gather_read_rows, prepared_graph
from engine.model import load_model_info
from engine.modelgen.builder import build_decoder, genai_config, write_model_dir
from engine.modelgen.synthetic import TINY, VARIANTS, random_weights
from engine.runtime.backend import HeadRows
from engine.runtime.cuda import CudaBackend, host_runtime
from tests.support import engines
from tests.support.engines import greedy_from_prompt
from tests.support.prompts import prompt_ids

EVERY_ROW = replace(TINY, read_rows=False)  # the same decoder, its head on every row


def load(path: Path, cache: Path, **options: object) -> Engine:
    return engines.load(path, graph_cache=cache, **options)


def spy_on_forwards(engine: Engine) -> list[tuple[int, int, HeadRows]]:
    """Record (real rows, width, what came back) for every prefill forward the backend runs."""
    seen: list[tuple[int, int, HeadRows]] = []
    run_rows = engine.backend.run_rows

    def recorded(variant, key, row, past, feed, ports, constants, read):  # type: ignore[no-untyped-def]
        out = run_rows(variant, key, row, past, feed, ports, constants, read)
        seen.append((int(read[-1]) + 1, key.width, HeadRows(np.array(out.logits), out.seen)))
        return out

    engine.backend.run_rows = recorded  # type: ignore[method-assign]
    return seen


def wrong_row_decoder(root: Path) -> Path:
    """A decoder that keeps only its last query row before the head yet declares one logits row
    per query row: rewritten, its head is handed the last *padded* row of a padded forward."""
    spec = replace(TINY, last_row_logits=True, read_rows=False)
    model = build_decoder(spec, random_weights(spec))
    logits = next(o for o in model.graph.output if o.name == "logits")
    logits.type.tensor_type.shape.dim[1].dim_param = "sequence_length"
    gather_read_rows(model)
    return write_model_dir(root / "wrong_row", model, genai_config(spec, context_length=1024, chunk_size=64))


def test_a_generated_decoder_runs_its_head_on_one_row_per_prefill_forward(model_dir, tmp_path) -> None:
    engine = load(model_dir(), tmp_path)
    forwards = spy_on_forwards(engine)
    engine.append(engine.open_session(), prompt_ids(100))  # 64 + 36 rows: widths 64, 44
    assert engine.info.logits_rows == "logits_rows"
    assert [(rows, width) for rows, width, _ in forwards] == [(64, 64), (36, 44)]
    assert all(out.logits.shape == (1, 1, TINY.vocab_size) for _, _, out in forwards)


def test_the_head_sees_exactly_the_real_last_row_on_padded_forwards(model_dir, tmp_path) -> None:
    engine = load(model_dir(), tmp_path)
    exact = load(model_dir(spec=EVERY_ROW), tmp_path, padding=False)
    forwards = spy_on_forwards(engine)
    for length in (5, 30, 50, 100):
        tokens = prompt_ids(length, seed=length)
        got = engine.append(engine.open_session(), tokens)
        want = exact.append(exact.open_session(), tokens)
        np.testing.assert_allclose(got, want, atol=1e-5)
    padded = [(rows, width, out) for rows, width, out in forwards if width > rows]
    assert padded, "the prompts above include padded forwards"
    for rows, width, out in padded:
        assert out.seen is not None and out.seen.tolist() == [rows - 1, width - 1]


def test_greedy_tokens_are_those_of_the_unrewritten_graph_padded_or_not(model_dir, tmp_path) -> None:
    every_row = load(model_dir(spec=EVERY_ROW), tmp_path, graph_read_only=True, padding=False)
    assert every_row.info.logits_rows is None
    for padding in (True, False):
        engine = load(model_dir(), tmp_path, padding=padding)
        for length in (3, 40, 64, 130):
            tokens = prompt_ids(length, seed=length)
            assert greedy_from_prompt(engine, tokens, 12) == greedy_from_prompt(every_row, tokens, 12)


# What a CUDA graph captures: every op on the device but Shape, whose host output is read as a shape.
DEVICE_GATHER_OPS = {"Shape", "ConstantOfShape", "ReduceSum", "Cast", "Sub", "Min", "Gather", "Concat"}


def device_engine(info_path: Path, cache: Path, **options: object) -> Engine:
    """The CUDA backend's engine, run on the host (numpy arrays for device buffers)."""
    opts = EngineOptions(graph_cache=cache, **options)  # type: ignore[arg-type]
    info = prepared_graph(load_model_info(info_path), opts.graph_cache_dir, on_device=True)
    return Engine(info, opts, CudaBackend(info, opts, host_runtime()))


def test_the_cuda_backend_gathers_the_read_rows_with_ops_a_cuda_graph_captures(model_dir, tmp_path) -> None:
    # The host-side gather's row arithmetic (Range, Size, Slice over the fed rows) is split between
    # host and device, which a CUDA graph capture refuses; the device form counts rows on the device.
    engine = device_engine(model_dir(), tmp_path)
    assert engine.info.logits_rows and engine.info.graph.parent.parent == tmp_path
    graph = onnx.load(str(engine.info.graph), load_external_data=False).graph
    added = [
        n
        for n in graph.node
        if n.name.startswith("read_rows.")
        or n.name.endswith(".read_rows")
        or n.output[0] == "logits_rows_seen"
    ]
    assert {n.op_type for n in added} == DEVICE_GATHER_OPS
    shape = next(n for n in added if n.op_type == "Shape")
    assert [n.op_type for n in graph.node if shape.output[0] in n.input] == ["ConstantOfShape"]
    assert "logits_rows" not in [t.name for t in graph.initializer]  # always fed: no default
    reference = load(model_dir(), tmp_path)
    forwards = spy_on_forwards(engine)
    for length in (3, 30, 64, 130):
        tokens = prompt_ids(length, seed=length)
        assert greedy_from_prompt(engine, tokens, 10) == greedy_from_prompt(reference, tokens, 10)
    padded = [(rows, width, out) for rows, width, out in forwards if width > rows]
    assert padded, "the prompts above include padded forwards"
    for rows, width, out in padded:
        assert out.logits.shape[1] == 1
        assert out.seen is not None and out.seen.tolist() == [rows - 1, width - 1]


def test_a_read_only_graph_that_gathers_on_the_host_loses_its_gather_on_cuda(model_dir, tmp_path) -> None:
    gathered = load_model_info(model_dir())
    info = prepared_graph(gathered, tmp_path, read_only=True, on_device=True)
    assert gathered.logits_rows and info.logits_rows is None
    graph = onnx.load(str(info.graph), load_external_data=False).graph
    assert not [n for n in graph.node if n.name.startswith("read_rows.")]
    assert "logits_rows_seen" not in [o.name for o in graph.output]
    every = load_model_info(model_dir(spec=EVERY_ROW))
    assert prepared_graph(every, tmp_path, read_only=True, on_device=True) == every


def test_a_model_directory_is_rewritten_into_the_cache_and_left_untouched(model_dir, tmp_path) -> None:
    path = model_dir(spec=EVERY_ROW)
    before = hashlib.sha256((path / "model.onnx").read_bytes()).hexdigest()
    engine = load(path, tmp_path / "graphs")
    assert engine.info.logits_rows and engine.info.graph.is_relative_to(tmp_path / "graphs")
    assert hashlib.sha256((path / "model.onnx").read_bytes()).hexdigest() == before
    again = load(path, tmp_path / "graphs")
    assert again.info.graph == engine.info.graph  # the cached copy is reused
    assert len(list((tmp_path / "graphs").iterdir())) == 1


def test_an_engine_given_no_graph_cache_keeps_its_copies_in_a_temporary_directory_not_the_home(
    model_dir,
) -> None:
    engine = Engine.load(model_dir(spec=EVERY_ROW))
    assert engine.info.logits_rows  # rewritten, into the process's temporary graph cache
    assert engine.info.graph.is_relative_to(tempfile.gettempdir())
    assert not engine.info.graph.is_relative_to(Path.home())


def test_the_cache_keeps_one_copy_per_source_graph_when_the_source_changes(model_dir, tmp_path) -> None:
    path, other = model_dir(spec=EVERY_ROW), model_dir()
    cache = tmp_path / "graphs"
    first = prepared_graph(load_model_info(path), cache)
    on_cuda = prepared_graph(load_model_info(other), cache, on_device=True)  # another source: kept
    graph = path / "model.onnx"
    stat = graph.stat()
    os.utime(graph, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # the user replaced the model
    second = prepared_graph(load_model_info(path), cache)
    assert second.graph != first.graph and not first.graph.exists()
    kept = {second.graph.parent.name, on_cuda.graph.parent.name}
    assert {p.name for p in cache.iterdir()} == kept


def test_external_weights_stay_where_they_are_and_the_copy_runs(tmp_path) -> None:
    model = build_decoder(EVERY_ROW, random_weights(EVERY_ROW))
    source = tmp_path / "external"
    source.mkdir()
    onnx.save_model(model, str(source / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    (source / "genai_config.json").write_text(
        json.dumps(genai_config(EVERY_ROW, context_length=1024, chunk_size=64))
    )
    info = prepared_graph(load_model_info(source), tmp_path / "graphs")
    assert info.logits_rows and info.weights_dir == source
    assert not (info.graph.parent / "model.onnx.data").exists()  # the weights were not copied
    again = prepared_graph(load_model_info(source), tmp_path / "graphs")  # the cached copy, reused
    assert (again.graph, again.weights_dir) == (info.graph, source)
    tokens = prompt_ids(50)
    engine = load(source, tmp_path / "graphs")
    exact = load(source, tmp_path / "graphs", graph_read_only=True, padding=False)
    assert greedy_from_prompt(engine, tokens, 8) == greedy_from_prompt(exact, tokens, 8)


def test_a_read_only_model_keeps_its_head_on_every_row(model_dir, tmp_path) -> None:
    engine = load(model_dir(spec=EVERY_ROW), tmp_path, graph_read_only=True)
    forwards = spy_on_forwards(engine)
    engine.append(engine.open_session(), prompt_ids(30))  # one forward of width 44
    assert engine.info.logits_rows is None and not list(tmp_path.iterdir())
    assert [(out.logits.shape[1], out.seen) for _, _, out in forwards] == [(44, None)]


def test_an_unrewritable_graph_keeps_todays_path_and_its_self_check(model_dir, tmp_path) -> None:
    path = model_dir("last_row")  # its logits are one row, not one per query row
    with pytest.raises(CannotRewrite):
        find_head(onnx.load(str(path / "model.onnx")))
    engine = load(path, tmp_path)
    assert engine.info.logits_rows is None
    session = engine.open_session()
    engine.append(session, prompt_ids(30))
    assert not session.padding_on and session.stats.self_check_reruns == 1


def _self_check_trips_on_the_wrong_row(engine: Engine, exact: Engine) -> None:
    tokens = prompt_ids(100, seed=3)
    session = engine.open_session()
    got = engine.append(session, tokens[:30])  # one padded forward: 30 rows at width 44
    np.testing.assert_allclose(got, exact.append(exact.open_session(), tokens[:30]), atol=1e-5)
    assert not session.padding_on and session.stats.self_check_reruns == 1
    engine.append(session, tokens[30:])  # padding stays off for good
    assert session.stats.padded_rows == 0 and engine.stats().sessions_padding_off == 1


def test_the_self_check_trips_on_a_graph_that_hands_back_the_wrong_row(tmp_path) -> None:
    path = wrong_row_decoder(tmp_path)
    engine = load(path, tmp_path / "graphs")
    assert engine.info.logits_rows  # rewritten: its head reads what the gather hands it
    exact = load(path, tmp_path / "graphs", padding=False)
    _self_check_trips_on_the_wrong_row(engine, exact)


def test_the_device_backend_self_check_trips_on_the_wrong_row_too(tmp_path) -> None:
    path = wrong_row_decoder(tmp_path)
    engine = device_engine(path, tmp_path / "graphs", capacity=512)
    assert engine.info.logits_rows  # its own gather, in the device form
    exact = load(path, tmp_path / "graphs", padding=False)
    _self_check_trips_on_the_wrong_row(engine, exact)


def test_the_graph_reads_the_rows_named_or_every_row_when_none_are(model_dir) -> None:
    """The hook for per-row logits of a prompt (reads = width), and onnxruntime-genai's view:
    a rewritten graph fed no `logits_rows` returns every row, as before."""
    rewritten = ort.InferenceSession(str(model_dir() / "model.onnx"), providers=["CPUExecutionProvider"])
    every = ort.InferenceSession(
        str(model_dir(spec=EVERY_ROW) / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    width, rows = 20, 13
    empty = np.zeros((1, TINY.num_kv_heads, 0, TINY.head_size), np.float32)
    feeds = {
        "input_ids": np.asarray([prompt_ids(width)]),
        "attention_mask": np.ones((1, width), np.int64),
        **{f"past_key_values.{i}.{kind}": empty for i in range(TINY.num_layers) for kind in ("key", "value")},
    }
    want = every.run(["logits"], feeds)[0]
    (all_rows,) = rewritten.run(["logits"], feeds)
    np.testing.assert_allclose(all_rows, want, atol=1e-5)
    logits, seen = rewritten.run(
        ["logits", "logits_rows_seen"], {**feeds, "logits_rows": read_index(rows, width)}
    )
    np.testing.assert_allclose(logits[0, :rows], want[0, :rows], atol=1e-5)
    assert seen.tolist() == [*range(rows), *[rows - 1] * (width - rows), width - 1]


def test_variants_of_a_rewritten_graph_hold_one_logits_row_per_pool_row(model_dir, tmp_path) -> None:
    engine = load(model_dir(), tmp_path)
    engine.warm_up()
    vocab_bytes = TINY.vocab_size * 4
    for entry in engine.stats().variants.entries:
        rows = max(entry.key.batch, 1)
        assert entry.nbytes < rows * vocab_bytes + entry.key.width * rows * 8 + 64


def test_every_generated_variant_but_the_last_row_one_reads_rows(model_dir) -> None:
    for name in VARIANTS:
        info = load_model_info(model_dir(name))
        assert (info.logits_rows is None) == (name == "last_row"), name


def test_a_builder_style_head_after_a_fused_norm_is_found_and_reads_one_row() -> None:
    """onnxruntime-genai's builder ends in SkipSimplifiedLayerNormalization -> MatMul -> Cast."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    hidden, vocab = 8, 16
    inits = [
        numpy_helper.from_array(rng.standard_normal((vocab, hidden)).astype(np.float32), "embed"),
        numpy_helper.from_array(np.ones(hidden, np.float32), "gamma"),
        numpy_helper.from_array(rng.standard_normal((hidden, vocab)).astype(np.float32), "lm_head"),
    ]
    nodes = [
        helper.make_node("Gather", ["embed", "input_ids"], ["x"], axis=0),
        helper.make_node(
            "SkipSimplifiedLayerNormalization",
            ["x", "x", "gamma"],
            ["normed", "", "", "sum"],
            domain="com.microsoft",
            epsilon=1e-5,
        ),
        helper.make_node("MatMul", ["normed", "lm_head"], ["scores"]),
        helper.make_node("Cast", ["scores"], ["logits"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(
        nodes,
        "builder_style",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"])],
        [
            helper.make_tensor_value_info(
                "logits", TensorProto.FLOAT, ["batch_size", "sequence_length", vocab]
            )
        ],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 10
    every = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert find_head(model).hidden == "normed"
    gather_read_rows(model)
    read = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ids = {"input_ids": np.array([[1, 2, 3, 4, 5]])}
    want = every.run(["logits"], ids)[0]
    got, seen = read.run(["logits", "logits_rows_seen"], {**ids, "logits_rows": np.array([3])})
    np.testing.assert_allclose(got[0, 0], want[0, 3], atol=1e-6)
    assert seen.tolist() == [3, 4]


def prompt_logprobs(engine: Engine, tokens: list[int]) -> list[tuple[int, float, list[int]]]:
    task = engine.start_prefill(engine.open_session(), tokens, logprob_top=3)
    while not task.done:
        engine.prefill_step(task)
    return [(p.token, p.logprob, [i for i, _ in p.top]) for p in task.logprobs]


def test_prompt_logprobs_read_every_real_row_and_equal_those_of_the_every_row_head(
    model_dir, tmp_path
) -> None:
    engine = load(model_dir(), tmp_path)
    every_row = load(model_dir(spec=EVERY_ROW), tmp_path, graph_read_only=True, padding=False)
    forwards = spy_on_forwards(engine)
    for length in (2, 30, 100, 130):
        tokens = prompt_ids(length, seed=length)
        got, want = prompt_logprobs(engine, tokens), prompt_logprobs(every_row, tokens)
        assert [(t, top) for t, _, top in got] == [(t, top) for t, _, top in want]
        np.testing.assert_allclose([v for _, v, _ in got], [v for _, v, _ in want], atol=1e-5)
        assert [t for t, _, _ in got] == tokens[1:]
    padded = [(rows, width, out) for rows, width, out in forwards if width > rows]
    assert padded, "the prompts above include padded forwards"
    for rows, width, out in padded:  # every real row reached the head, the last one repeated, no padded row
        assert out.seen is not None and out.seen.tolist()[:-1] == [*range(rows), *[rows - 1] * (width - rows)]
