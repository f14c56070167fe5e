"""The CPU backend: one onnxruntime session over a KV pool, variants as reusable bindings.

The pool's blocks are bound as both past and present (one shared buffer, so
nothing is copied per step). A prefill variant holds the input and logits
buffers of one query width and rebinds the KV only when the row changes; a
decode variant binds the first B rows of the pool once, for good.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnxruntime as ort

from engine.model import READ_ROWS_DIM, SEEN_OUTPUT, ModelInfo, Port
from engine.options import EngineOptions
from engine.runtime.backend import HeadRows, ParkedRow
from engine.runtime.host_draws import HostDraws, host_cores
from engine.runtime.pool import KvPool, release_pages
from engine.runtime.variants import VariantKey
from engine.sampling import Sampler, TokenLogprobs, log_probs, token_logprobs


def _dtype(name: str) -> np.dtype:
    return np.dtype(np.float16 if name == "float16" else name)


def inference_session(info: ModelInfo, so: ort.SessionOptions, providers: list[Any]) -> ort.InferenceSession:
    """The session over `info.graph`; a rewritten copy whose weights stay in the model directory
    is handed over as bytes, with that directory as where its external data lies."""
    if info.weights_dir is None:
        return ort.InferenceSession(str(info.graph), so, providers=providers)
    so.add_session_config_entry("session.model_external_initializers_file_folder_path", str(info.weights_dir))
    return ort.InferenceSession(info.graph.read_bytes(), so, providers=providers)


def resolve_dims(port: Port, width: int, batch: int = 1, reads: int = 1) -> tuple[int, ...] | None:
    """A port's concrete shape at query width `width`, batch `batch` and `reads` rows reaching the head;
    None if a dimension stays unknown."""
    named = {"batch_size": batch, "batch": batch, "sequence_length": width, READ_ROWS_DIM: reads}
    dims = [d if isinstance(d, int) else named.get(d) for d in port.dims]
    return None if any(d is None for d in dims) else tuple(int(d) for d in dims if d is not None)


@dataclass
class CpuVariant:
    key: VariantKey
    feed: np.ndarray
    ports: dict[str, np.ndarray]
    logits: np.ndarray | None
    positions: np.ndarray | None
    binding: ort.IOBinding | None
    held: list[ort.OrtValue]
    bound_row: int = -1  # the pool row whose KV the binding holds (prefill variants)
    read: np.ndarray | None = None  # the query rows the head reads (a graph that takes them)
    seen: np.ndarray | None = None  # ... and the rows it saw

    @property
    def nbytes(self) -> int:
        arrays = [self.feed, *self.ports.values(), self.logits, self.positions, self.read, self.seen]
        return sum(a.nbytes for a in arrays if a is not None)

    def release(self) -> None:
        self.binding = None
        self.held.clear()


@dataclass
class RowState:
    """A row's recurrent state: read and rewritten by one forward, so in and out are two buffers."""

    current: dict[str, np.ndarray]
    spare: dict[str, np.ndarray] = field(default_factory=dict)


class CpuBackend:
    name = "cpu"
    evictable = True
    weights_bytes = 0
    async_capable = False
    chains = False
    # MLAS: a row in any multi-row forward is the same row on the CPUs measured so far; the engine
    # measures it on this machine when the model loads (engine/executor/kernels.py).
    rows_follow_width = False
    batch_commits_rows = True  # onnxruntime's CPU attention touches every row of the batch
    # A CPU prefill is bound by arithmetic per row: prompts sharing a forward would only wait for
    # each other. Each prefills alone.
    prompt_batch = 1
    staging_rows = 0  # prefill forwards bind the session's own pool row

    def __init__(self, info: ModelInfo, options: EngineOptions) -> None:
        self.info = info
        so = ort.SessionOptions()
        if options.intra_op_threads:
            so.intra_op_num_threads = options.intra_op_threads
        so.log_severity_level = 3
        # onnxruntime's threads spin inside a forward (its parallel sections), not after it: between
        # two forwards the cores are the host draws' (engine/runtime/host_draws.py). With the
        # default residual spinning, a step's 8 sampled rows took ~10 ms on 2 threads as on one;
        # stopped, ~6 ms, and a greedy step is as fast (bench/results/sampled-cpu-2026-12-03c).
        so.add_session_config_entry("session.force_spinning_stop", "1")
        self.session = inference_session(info, so, ["CPUExecutionProvider"])
        self.before_forward: Callable[[], None] | None = None
        self.pool: KvPool | None = None
        self.store = np.zeros((0, info.vocab_size), np.float32)
        self.states: list[RowState] = []
        self._row_values: dict[tuple[int, int], list[ort.OrtValue]] = {}  # (first row, rows) -> KV + mask
        self.released_bytes = 0  # KV pages handed back by release_row
        self.draws = HostDraws(host_cores(options.intra_op_threads))  # a step's sampled rows, on every core

    # -- pool -------------------------------------------------------------------------
    def allocate(self, rows: int, capacity: int) -> KvPool:
        info = self.info
        self.pool = KvPool(
            np,
            layers=info.num_layers,
            rows=rows,
            kv_heads=info.num_kv_heads,
            capacity=capacity,
            head_size=info.head_size,
            dtype=_dtype(info.kv_dtype),
        )
        self.store = np.zeros((rows, info.vocab_size), _dtype(info.logits.dtype))
        for _ in range(rows):
            zeros = {p.name: np.zeros(resolve_dims(p, 1) or (), _dtype(p.dtype)) for p, _ in info.state_ports}
            self.states.append(RowState(zeros, {n: np.zeros_like(a) for n, a in zeros.items()}))
        return self.pool

    def _values(self, first: int, count: int) -> list[ort.OrtValue]:
        """OrtValues over rows [first, first + count) of every KV block, then of the mask (kept)."""
        values = self._row_values.get((first, count))
        if values is None:
            assert self.pool is not None
            pool, span = self.pool, slice(first, first + count)
            arrays = [pool.layer(i, w)[span] for i in range(self.info.num_layers) for w in (0, 1)]
            values = [ort.OrtValue.ortvalue_from_numpy(a) for a in [*arrays, pool.mask[span]]]
            self._row_values[(first, count)] = values
        return values

    def _bind_rows(self, variant: CpuVariant, first: int, count: int) -> None:
        assert variant.binding is not None
        *kv, mask = self._values(first, count)
        variant.binding.bind_ortvalue_input(self.info.mask, mask)
        names = [
            pair
            for layer in zip(self.info.kv_inputs, self.info.kv_outputs, strict=True)
            for pair in zip(*layer, strict=True)
        ]
        for (name_in, name_out), value in zip(names, kv, strict=True):
            # Past and present share one buffer at capacity: no copy per step.
            variant.binding.bind_ortvalue_input(name_in, value)
            variant.binding.bind_ortvalue_output(name_out, value)

    def copy_rows(self, src: int, dst: int, length: int) -> None:
        """A slice copy inside the pool: the first `length` positions of every layer, the logits row."""
        assert self.pool is not None
        block = self.pool.block
        block[:, :, dst, :, :length] = block[:, :, src, :, :length]
        self.store[dst] = self.store[src]

    def clear_state(self, row: int) -> None:
        for array in self.states[row].current.values():
            array.fill(0)

    def park_row(self, row: int, length: int) -> ParkedRow:
        assert self.pool is not None
        return ParkedRow(self.pool.block[:, :, row, :, :length].copy(), self.store[row].copy())

    def unpark_row(self, row: int, parked: ParkedRow) -> None:
        assert self.pool is not None
        self.pool.block[:, :, row, :, : parked.kv.shape[3]] = parked.kv
        self.store[row] = parked.logits

    def spill_row(self, parked: ParkedRow) -> ParkedRow:
        return parked  # host memory already

    def release_row(self, row: int) -> None:
        """The row's KV pages go back to the system: a free row costs no memory until written."""
        assert self.pool is not None
        self.released_bytes += sum(release_pages(slab) for slab in self.pool.row_slabs(row))

    # -- variants -----------------------------------------------------------------------
    def prepare(self, key: VariantKey) -> CpuVariant:
        info, w, b = self.info, key.width, max(key.batch, 1)
        feed = np.zeros(resolve_dims(info.feed, w, b) or (b, w), _dtype(info.feed.dtype))
        ports = {
            p.name: np.zeros(resolve_dims(p, w) or (), _dtype(p.dtype))
            for p in info.supplied_ports
            if p.name in key.ports
        }
        logits_shape = resolve_dims(info.logits, w, b, key.reads)
        logits = None if logits_shape is None else np.zeros(logits_shape, _dtype(info.logits.dtype))
        positions = np.zeros((b, w), np.int64) if info.position_ids else None
        # A decode variant reads query row 0 of each batch row: the zeros it starts with.
        read = np.zeros(key.reads, np.int64) if info.logits_rows else None
        seen = np.zeros(key.reads + 1, np.int64) if info.logits_rows else None
        binding = self.session.io_binding()
        # OrtValues over numpy buffers share their memory: a copy into the buffer is the bind.
        held = []
        for name, array in [
            (info.feed.name, feed),
            *ports.items(),
            (info.position_ids, positions),
            (info.logits_rows, read),
        ]:
            if array is not None and name is not None:
                held.append(ort.OrtValue.ortvalue_from_numpy(array))
                binding.bind_ortvalue_input(name, held[-1])
        if logits is None:
            binding.bind_output("logits", "cpu")
        else:
            held.append(ort.OrtValue.ortvalue_from_numpy(logits))
            binding.bind_ortvalue_output("logits", held[-1])
        if seen is not None:
            held.append(ort.OrtValue.ortvalue_from_numpy(seen))
            binding.bind_ortvalue_output(SEEN_OUTPUT, held[-1])
        variant = CpuVariant(key, feed, ports, logits, positions, binding, held, read=read, seen=seen)
        if key.batch:
            self._bind_rows(variant, 0, key.batch)  # a decode variant binds rows [0, B) for good
        return variant

    # -- forwards -----------------------------------------------------------------------
    def run_rows(
        self,
        variant: CpuVariant | None,
        key: VariantKey,
        row: int,
        past: int,
        feed: np.ndarray,
        ports: Mapping[str, np.ndarray],
        constants: Mapping[str, np.ndarray],
        read: np.ndarray,
    ) -> HeadRows:
        variant = variant or self.prepare(key)
        assert variant.binding is not None
        np.copyto(variant.feed, feed.reshape(variant.feed.shape))
        if variant.read is not None:
            np.copyto(variant.read, read)
        for name, array in ports.items():
            np.copyto(variant.ports[name], array)
        if variant.positions is not None:
            variant.positions[0] = np.arange(past, past + key.width)
        if variant.bound_row != row:
            self._bind_rows(variant, row, 1)
            variant.bound_row = row
        for name, array in constants.items():
            variant.binding.bind_cpu_input(name, array)
        state = self.states[row] if self.states else None
        for port, out_name in self.info.state_ports:
            assert state is not None
            variant.binding.bind_cpu_input(port.name, state.current[port.name])
            spare = ort.OrtValue.ortvalue_from_numpy(state.spare[port.name])
            variant.binding.bind_ortvalue_output(out_name, spare)
        logits = self._run(variant, state)
        return HeadRows(logits, None if variant.seen is None else variant.seen.copy())

    def allocate_prompts(self, prompts: int, positions: int) -> int:
        raise NotImplementedError("the CPU backend prefills each prompt alone (prompt_batch 1)")

    def run_prompts(
        self,
        variant: CpuVariant | None,
        key: VariantKey,
        rows: Sequence[int],
        feed: np.ndarray,
        read: np.ndarray,
    ) -> HeadRows:
        raise NotImplementedError("the CPU backend prefills each prompt alone (prompt_batch 1)")

    def run_batch(
        self,
        variant: CpuVariant | None,
        key: VariantKey,
        ids: np.ndarray,
        positions: np.ndarray,
        wait: bool = True,
    ) -> np.ndarray:
        variant = variant or self.prepare(key)
        np.copyto(variant.feed, ids.reshape(variant.feed.shape))
        if variant.positions is not None:
            np.copyto(variant.positions, positions)
        return self._run(variant, None)

    def chain_batch(
        self,
        variant: CpuVariant | None,
        key: VariantKey,
        rows: Sequence[int],
        logits: Any,
        grow: Sequence[int],
        samplers: Sequence[Sampler],
    ) -> list[int] | None:
        """Forwards on the CPU finish before they return: nothing to queue behind."""
        return None

    def settle(self) -> None:
        """Forwards on the CPU always finish before they return: nothing to wait for."""

    def _run(self, variant: CpuVariant, state: RowState | None) -> np.ndarray:
        assert variant.binding is not None
        if self.before_forward is not None:
            self.before_forward()
        self.session.run_with_iobinding(variant.binding)
        if state is not None:
            state.current, state.spare = state.spare, state.current
        if variant.logits is not None:
            return variant.logits
        # Logits were bound first among the outputs, so they are the binding's first output.
        return np.asarray(variant.binding.get_outputs()[0].numpy())

    # -- logits -----------------------------------------------------------------------
    def keep_row(self, row: int, logits: np.ndarray, index: int) -> None:
        self.store[row] = logits[0, index]

    def keep_batch(self, rows: Sequence[int], logits: np.ndarray) -> None:
        if rows and list(rows) == list(range(rows[0], rows[0] + len(rows))):
            self.store[rows[0] : rows[0] + len(rows)] = logits[rows[0] : rows[0] + len(rows), 0]
        else:
            self.store[list(rows)] = logits[list(rows), 0]

    def choose(
        self, rows: Sequence[int], samplers: Sequence[Sampler], histories: Sequence[Sequence[int]]
    ) -> list[int]:
        if not len(rows) == len(samplers) == len(histories):
            raise ValueError(f"{len(rows)} rows, {len(samplers)} samplers, {len(histories)} histories")
        return self.draws.choose(lambda i: self.store[rows[i]], samplers, histories)

    def logprobs(
        self, rows: Sequence[int], tokens: Sequence[int], top: int, allowed: Sequence[np.ndarray | None] = ()
    ) -> list[TokenLogprobs]:
        logits = self.store[list(rows)]
        for i, mask in enumerate(allowed):
            if mask is not None:
                logits[i] = np.where(mask, logits[i], np.float32(-np.inf))
        chosen, ids, values = log_probs(np, logits, np.asarray(tokens, np.int64), top)
        return token_logprobs(tokens, chosen, ids, values)

    def prompt_logprobs(self, logits: np.ndarray, tokens: Sequence[int], top: int) -> list[TokenLogprobs]:
        chosen, ids, values = log_probs(np, logits[0, : len(tokens)], np.asarray(tokens, np.int64), top)
        return token_logprobs(tokens, chosen, ids, values)

    def row_logits(self, row: int) -> np.ndarray:
        return np.array(self.store[row], copy=True)

    def memory(self) -> dict[str, int]:
        return {"logits_store": int(self.store.nbytes)}

    def free_device_bytes(self) -> int | None:
        return None
