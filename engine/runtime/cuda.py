"""The CUDA backend: the KV pool on the device, CUDA-graph variants at fixed addresses.

A captured graph replays against the addresses it was captured with. A decode
variant binds the first B rows of the pool, which never move, so one graph per
batch width serves every set of sessions. A prefill variant binds the staging
row (one batch-1 KV block and mask of its own): a session's prefix is copied in
before its forward when the staging row does not hold it yet, and the rows the
forward wrote are copied back to its pool row after, so a prompt's chunks run
as graph replays whatever row the session has.

New prompts can share a prefill forward (`run_prompts`): their first chunks run in a staging
block of P rows of one chunk's positions each, bound by every such variant, and each prompt's
rows are copied to its pool row after; one forward of P prompts costs the device little more
than one prompt's (a 512-row forward of a small model is bound by launches, not arithmetic).

The attention masks and the small inputs live in pinned host memory the device
reads in place (`Placement.host_zeros`): writing them is a host store. Logits stay
on the device: each row's next-token logits are kept in a device store, greedy
tokens (and the repetition penalty) are chosen there, so a decode step moves
B token ids to the host (device_logits.py, which `CudaBackend` inherits).

The same code runs on the CPU provider with numpy buffers (`host_runtime`),
which is how the CPU tests cover staging, batching and eager fallbacks.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort
import structlog

from engine.model import SEEN_OUTPUT, ModelInfo
from engine.options import EngineOptions
from engine.runtime.backend import HeadRows, ParkedRow
from engine.runtime.cpu import _dtype, inference_session, resolve_dims
from engine.runtime.cuda_runtime import CudaUnavailable, Placement, cuda_runtime, host_runtime
from engine.runtime.device_logits import DeviceLogits
from engine.runtime.forwards import EAGER, Forwards
from engine.runtime.greedy import GreedyRows
from engine.runtime.masks import MASKS_HELD, MaskTable
from engine.runtime.pool import KvPool
from engine.runtime.sampled import SampledRows
from engine.runtime.staging import Staging
from engine.runtime.variants import VariantKey
from engine.sampling import Sampler

log = structlog.get_logger("ladder.engine")

__all__ = ["CudaBackend", "CudaUnavailable", "Placement", "cuda_runtime", "host_runtime"]


@dataclass
class DeviceVariant:
    key: VariantKey
    graph_id: int
    inputs: dict[str, Any]
    logits: Any
    binding: Any
    held_bytes: int = 0  # device memory the capture took and keeps
    captured: bool = False
    seen: Any = None  # on a graph that gathers the rows it reads: the rows its head saw (pinned host)

    @property
    def nbytes(self) -> int:
        own = sum(int(a.nbytes) for a in self.inputs.values()) + int(self.logits.nbytes)
        return own + self.held_bytes + (0 if self.seen is None else int(self.seen.nbytes))

    def release(self) -> None:
        # The buffers go; a captured graph stays with the onnxruntime session until it closes.
        self.binding = None


class CudaBackend(DeviceLogits):
    name = "cuda"
    evictable = False  # onnxruntime cannot release one captured graph
    async_capable = True  # a decode forward can be launched without waiting (see decode.py's lookahead)
    chains = True  # onnxruntime runs on the backend's stream: work queued there follows its forwards
    rows_follow_width = True  # cuBLAS and MatMulNBits pick kernels by M: measured on the H200 (issue 22)
    batch_commits_rows = False  # the pool is device memory, allocated whole up front

    def __init__(self, info: ModelInfo, options: EngineOptions, runtime: Placement | None = None) -> None:
        if info.recurrent_state:
            raise CudaUnavailable("decoders with recurrent state are not supported on the CUDA backend")
        self.info = info
        self.rt = runtime or cuda_runtime(options)
        self.xp = self.rt.xp
        so = ort.SessionOptions()
        so.log_severity_level = 3
        before = self.rt.free_bytes()
        self.session = inference_session(info, so, self.rt.providers)
        self.weights_bytes = max(0, before - self.rt.free_bytes())
        self.pool: KvPool | None = None
        self.staging: Staging | None = None
        self.prompts: Any = None  # the KV block [layers, 2, P, kv_heads, positions, head] prompts run in
        # The most new prompts one prefill forward takes (the engine asks for fewer, or none).
        self.prompt_batch = options.prefill_batch or (8 if self.rt.device == "cuda" else 1)
        self.staging_rows = 1  # the Staging row prefill variants bind (engine/runtime/staging.py)
        self.store: Any = None
        self.gathered: Any = None
        self.indexes = {}
        self._graph_ids = itertools.count(1)
        self.queued = False  # cupy work is queued that the next forward must wait for
        self.in_flight = False  # a forward was launched without waiting
        self.captures = 0
        self.forwards = Forwards(self.session, self.rt.graphs, options.replay_thread, self.rt.replay_wait)
        self.before_forward: Callable[[], None] | None = None
        self.profile = False  # when set, the wall time spent inside onnxruntime's run is summed
        self.run_ms = 0.0
        self.profiled_forwards = 0
        if self.rt.device == "cuda":
            name = self.xp.cuda.runtime.getDeviceProperties(self.rt.device_id)["name"]
            log.info(
                "cuda_backend",
                device=name.decode() if isinstance(name, bytes) else name,
                graphs=self.rt.graphs,
                cuda_wait=self.rt.waits,
                weights_bytes=self.weights_bytes,
            )

    # -- pool -------------------------------------------------------------------------
    def allocate(self, rows: int, capacity: int) -> KvPool:
        info = self.info
        with self.rt.enter():
            self.pool = KvPool(
                self.xp,
                layers=info.num_layers,
                rows=rows,
                kv_heads=info.num_kv_heads,
                capacity=capacity,
                head_size=info.head_size,
                dtype=_dtype(info.kv_dtype),
                host_zeros=self.rt.host_zeros,
            )
            self.staging = Staging(self.pool, self.rt.host_zeros, self.rt.copy_positions)
            self.store = self.xp.zeros((rows, info.vocab_size), _dtype(info.logits.dtype))
            # Scratch for gathering rows that are not contiguous: no allocation per step, memory flat.
            self.gathered = self.xp.zeros_like(self.store)
        self.greedy = GreedyRows(self.rt, rows, self.store.dtype)
        # Sampled rows are drawn on the device (host_runtime draws them on the host, as the CPU does).
        self.sampled = (
            SampledRows(self.rt, rows, self.store.dtype, info.vocab_size)
            if self.rt.device == "cuda"
            else None
        )
        # Structured output: each constraint state's allowed-token mask, uploaded once.
        self.masks = MaskTable(self.xp, int(self.store.shape[-1]), max(MASKS_HELD, 2 * self.pool.rows + 1))
        return self.pool

    def allocate_prompts(self, prompts: int, positions: int) -> int:
        """The staging block `run_prompts` binds: `prompts` rows of `positions` each; its bytes."""
        assert self.pool is not None
        info = self.info
        shape = (info.num_layers, 2, prompts, info.num_kv_heads, positions, info.head_size)
        with self.rt.enter():
            self.prompts = self.xp.zeros(shape, _dtype(info.kv_dtype))
        return int(self.prompts.nbytes)

    def copy_rows(self, src: int, dst: int, length: int) -> None:
        """A device-to-device copy of the first `length` positions of every layer and of the logits
        row, queued on the backend's stream (the next forward waits for it)."""
        assert self.pool is not None and self.staging is not None
        with self.rt.enter():
            self.rt.copy_positions(self.pool.block, dst, self.pool.block, src, 0, length)
            self.store[dst] = self.store[src]
        self.staging.changed(dst)
        self.queued = True

    def clear_state(self, row: int) -> None:
        """No recurrent state on this backend: nothing to clear."""

    def park_row(self, row: int, length: int) -> ParkedRow:
        """A device copy (device memory first: parking and unparking are one copy kernel each)."""
        assert self.pool is not None
        with self.rt.enter():
            parked = ParkedRow(self.pool.block[:, :, row, :, :length].copy(), self.store[row].copy())
        self.queued = True
        return parked

    def unpark_row(self, row: int, parked: ParkedRow) -> None:
        assert self.pool is not None and self.staging is not None
        with self.rt.enter():  # a copy spilled to pinned host memory goes up first
            kv = parked.kv if parked.on_device else self.xp.asarray(parked.kv)
            logits = parked.logits if parked.on_device else self.xp.asarray(parked.logits)
            self.pool.block[:, :, row, :, : parked.kv.shape[3]] = kv
            self.store[row] = logits
        self.staging.changed(row)
        self.queued = True

    def spill_row(self, parked: ParkedRow) -> ParkedRow:
        if not parked.on_device:
            return parked
        with self.rt.enter():
            kv = self.rt.host_zeros(parked.kv.shape, parked.kv.dtype)
            logits = self.rt.host_zeros(parked.logits.shape, parked.logits.dtype)
            parked.kv.get(out=kv, stream=self.rt.stream)
            parked.logits.get(out=logits, stream=self.rt.stream)
            self.rt.stream.synchronize()
        return ParkedRow(kv, logits)

    def release_row(self, row: int) -> None:
        """Device memory is allocated whole: nothing to hand back."""

    # -- variants -------------------------------------------------------------------------
    def prepare(self, key: VariantKey) -> DeviceVariant:
        return self._variant(key, next(self._graph_ids) if self.rt.graphs else EAGER)

    def _variant(self, key: VariantKey, graph_id: int) -> DeviceVariant:
        info, w, b = self.info, key.width, max(key.batch, key.prompts, 1)
        assert self.pool is not None and self.staging is not None
        with self.rt.enter():
            # Inputs live in host memory the device reads in place: writing one is a host store.
            zeros = self.rt.host_zeros
            inputs = {info.feed.name: zeros(resolve_dims(info.feed, w, b) or (b, w), _dtype(info.feed.dtype))}
            for port in info.supplied_ports:
                if port.name in key.ports:
                    inputs[port.name] = zeros(resolve_dims(port, w) or (), _dtype(port.dtype))
            if info.position_ids:
                inputs[info.position_ids] = zeros((b, w), np.int64)
            seen = None
            if info.logits_rows:  # a decode variant reads query row 0 of each batch row: the zeros
                inputs[info.logits_rows] = zeros((key.reads,), np.int64)
                # Written by the forward where the host reads it: the self-check after every forward
                # costs no device-to-host copy (one took 0.1-0.2 ms of each prefill forward).
                seen = zeros((key.reads + 1,), np.int64)
            logits_shape = resolve_dims(info.logits, w, b, key.reads)
            if logits_shape is None:
                raise CudaUnavailable(f"logits shape {info.logits.dims} is not fixed by the query width")
            logits = self.xp.zeros(logits_shape, _dtype(info.logits.dtype))
        binding = self.session.io_binding()
        for name, array in inputs.items():
            self._bind(binding.bind_input, name, array)
        self._bind(binding.bind_output, "logits", logits)
        if seen is not None:
            self._bind(binding.bind_output, SEEN_OUTPUT, seen)
        # A decode variant binds the pool's first B rows, a prompts variant the prompt staging
        # block's first P (and a mask of ones as wide as the forward: no past, so GroupQueryAttention
        # takes it as a first prompt, the one case it runs several rows of several sequences in), a
        # prefill variant the staging row.
        rows = slice(0, key.batch or key.prompts)
        if key.batch:
            self._bind(binding.bind_input, info.mask, self.pool.mask[rows])
        elif key.prompts:
            if self.prompts is None:
                raise CudaUnavailable("no prompt staging block: allocate_prompts first")
            inputs[info.mask] = self.rt.host_zeros((key.prompts, w), np.int64)
            inputs[info.mask][:] = 1
            self._bind(binding.bind_input, info.mask, inputs[info.mask])
        else:
            self._bind(binding.bind_input, info.mask, self.staging.mask)
        for i, (names_in, names_out) in enumerate(zip(info.kv_inputs, info.kv_outputs, strict=True)):
            for which, (name_in, name_out) in enumerate(zip(names_in, names_out, strict=True)):
                if key.batch:
                    block = self.pool.layer(i, which)[rows]
                else:
                    block = self.prompts[i, which, rows] if key.prompts else self.staging.block[i, which]
                # Past and present share one buffer at capacity: no copy per step.
                self._bind(binding.bind_input, name_in, block)
                self._bind(binding.bind_output, name_out, block)
        return DeviceVariant(key, graph_id, inputs, logits, binding, seen=seen)

    def _bind(self, bind: Any, name: str, array: Any) -> None:
        bind(name, self.rt.device, self.rt.device_id, array.dtype, list(array.shape), self.rt.ptr(array))

    # -- forwards ---------------------------------------------------------------------------
    def run_rows(
        self,
        variant: DeviceVariant | None,
        key: VariantKey,
        row: int,
        past: int,
        feed: np.ndarray,
        ports: Mapping[str, np.ndarray],
        constants: Mapping[str, np.ndarray],
        read: np.ndarray,
    ) -> HeadRows:
        variant = variant or self._variant(key, EAGER)
        assert self.pool is not None and self.staging is not None and variant.binding is not None
        staging, width = self.staging, key.width
        with self.rt.enter():
            self.queued |= staging.load(self.pool, row, past)
            self.rt.upload(variant.inputs[self.info.feed.name], feed)
            for name, array in ports.items():
                self.rt.upload(variant.inputs[name], array)
            for name, array in constants.items():
                self._constant(variant, name, array)
            if self.info.position_ids:
                variant.inputs[self.info.position_ids][0] = np.arange(past, past + width)
            if self.info.logits_rows:
                variant.inputs[self.info.logits_rows][:] = read
            staging.set_mask(past + width)
            self._execute(variant)
            # The forward has finished: what its head saw is already in host memory.
            seen = None if variant.seen is None else variant.seen.copy()
            staging.store(self.pool, past, past + width)
            self.queued = True
        return HeadRows(variant.logits, seen)

    def run_prompts(
        self,
        variant: DeviceVariant | None,
        key: VariantKey,
        rows: Sequence[int],
        feed: np.ndarray,
        read: np.ndarray,
    ) -> HeadRows:
        """One forward of `key.width` rows for each of up to `key.prompts` new prompts (no past):
        `feed` [len(rows), width], prompt i's rows copied to pool row rows[i] after (staging rows
        past them run zeros and are dropped). `read` [key.reads]: the query rows the head reads,
        the same for every prompt. Logits [prompts, reads, vocab]."""
        variant = variant or self._variant(key, EAGER)
        assert self.pool is not None and self.prompts is not None and variant.binding is not None
        staging, width, count = self.prompts, key.width, len(rows)
        with self.rt.enter():
            ids = np.zeros((key.prompts, width), feed.dtype)
            ids[:count] = feed
            self.rt.upload(variant.inputs[self.info.feed.name], ids)
            if self.info.position_ids:
                variant.inputs[self.info.position_ids][:] = np.arange(width)
            if self.info.logits_rows:
                variant.inputs[self.info.logits_rows][:] = read
            self._execute(variant)
            seen = None if variant.seen is None else variant.seen.copy()
            for i, row in enumerate(rows):
                self.rt.copy_positions(self.pool.block, row, staging, i, 0, width)
                if self.staging is not None:
                    self.staging.changed(row)
            self.queued = True
        return HeadRows(variant.logits, seen)

    def run_batch(
        self,
        variant: DeviceVariant | None,
        key: VariantKey,
        ids: np.ndarray,
        positions: np.ndarray,
        wait: bool = True,
    ) -> Any:
        variant = variant or self._variant(key, EAGER)
        assert self.staging is not None
        with self.rt.enter():
            self.rt.upload(variant.inputs[self.info.feed.name], ids)
            if self.info.position_ids:
                self.rt.upload(variant.inputs[self.info.position_ids], positions)
            if 0 <= self.staging.row < key.batch:
                self.staging.written(int(positions[self.staging.row, 0]))
            self._execute(variant, wait)
        return variant.logits

    def chain_batch(
        self,
        variant: DeviceVariant | None,
        key: VariantKey,
        rows: Sequence[int],
        logits: Any,
        grow: Sequence[int],
        samplers: Sequence[Sampler],
    ) -> list[int] | None:
        """Keep, choose (writing the next forward's ids, masks and positions on the device) and launch,
        all queued on the backend's stream behind the forward in flight: the device goes from one
        forward to the next through two small kernels, whatever the host is doing. The host waits
        only for the tokens, while the next forward runs."""
        assert self.pool is not None and self.staging is not None
        if variant is None or variant.binding is None or (variant.graph_id != EAGER and not variant.captured):
            return None  # an uncaptured graph captures on its first run, which waits for everything
        feed = variant.inputs[self.info.feed.name]
        positions = variant.inputs[self.info.position_ids] if self.info.position_ids else None
        if feed.dtype != np.int64:
            return None
        sampled = not all(s.params.greedy for s in samplers)
        if sampled and self.sampled is None:
            return None  # host_runtime: sampled rows draw on the host
        self.forwards.launched()  # the forward in flight is on the stream before its logits are read
        self.keep_batch(rows, logits)
        self.in_flight = True  # from here the device holds work a failure must wait for
        with self.rt.enter():
            if sampled:
                assert self.sampled is not None
                self.sampled.fill(
                    0,
                    self.row_addresses(rows),
                    [self.store.dtype == np.float32] * len(rows),
                    [s.params for s in samplers],
                    [s.key for s in samplers],
                    grow,
                )
                chosen = self.sampled.launch(len(rows), chain=(rows, grow, feed, self.pool.mask, positions))
            else:
                chosen = self.greedy.chain(self.store, rows, grow, feed, self.pool.mask, positions)
            staged = self.staging.row  # one lookup, not a call per row: this is every decode step
            if staged in rows:
                self.staging.written(int(grow[list(rows).index(staged)]))
            self._run(variant, wait=False)
        self.queued = False  # what was queued runs before the forward: it is on the same stream
        if sampled:
            assert self.sampled is not None
            return self.sampled.chosen(len(rows), chosen)
        return self.greedy.chosen(len(rows), chosen)

    def settle(self) -> None:
        if self.in_flight:
            self.in_flight = False
            try:
                self.forwards.launched()  # raises what the launch raised, once
            finally:
                self.rt.wait_device()  # onnxruntime's own stream included

    def _constant(self, variant: DeviceVariant, name: str, array: np.ndarray) -> None:
        buffer = variant.inputs.get(name)
        if buffer is None:
            # First use: give the constant a fixed address before the graph is captured.
            buffer = variant.inputs[name] = self.rt.host_zeros(array.shape, array.dtype)
            self._bind(variant.binding.bind_input, name, buffer)
        self.rt.upload(buffer, array)

    def _run(self, variant: DeviceVariant, wait: bool) -> None:
        if self.before_forward is not None:
            self.before_forward()
        self.forwards.run(variant.binding, variant.graph_id, wait)

    def _execute(self, variant: DeviceVariant, wait: bool = True) -> None:
        """Run the forward once cupy's queue is done; with `wait`, return when it has finished."""
        capturing = variant.graph_id != EAGER and not variant.captured
        wait = wait or capturing  # a capture runs to its end before anything else
        self.settle()
        before = self.rt.free_bytes() if capturing else 0
        if self.queued:
            self.rt.wait_queue()  # staging copies and logits stores go first
            self.queued = False
        start = time.perf_counter()
        self._run(variant, wait)
        self.in_flight = not wait
        if self.profile and wait:
            self.run_ms += (time.perf_counter() - start) * 1e3
            self.profiled_forwards += 1
        if capturing:
            variant.held_bytes = max(0, before - self.rt.free_bytes())
            variant.captured = True
            self.captures += 1
            log.info(
                "graph_captured",
                width=variant.key.width,
                batch=variant.key.batch,
                graph_id=variant.graph_id,
                held_bytes=variant.held_bytes,
            )

    # -- accounting -------------------------------------------------------------------------
    def free_device_bytes(self) -> int | None:
        return self.rt.free_bytes() if self.rt.device == "cuda" else None

    def memory(self) -> dict[str, int]:
        """Device bytes by owner and the staging copies: what stats report beside the budget."""
        staging, sampled = self.staging, getattr(self, "sampled", None)
        return {
            "weights": self.weights_bytes,
            "captures": self.captures,
            "staging_bytes": 0 if staging is None else int(staging.block.nbytes),
            "prompt_staging_bytes": 0 if self.prompts is None else int(self.prompts.nbytes),
            "staging_copied_positions": 0 if staging is None else staging.copied_positions,
            "logits_store": 0 if self.store is None else int(self.store.nbytes),
            "sampling_scratch": 0 if sampled is None else int(sampled.scratch.nbytes),
            "constraint_masks": self.masks.nbytes if hasattr(self, "masks") else 0,
        }
