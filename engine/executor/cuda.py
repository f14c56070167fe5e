"""The CUDA backend: device-resident KV, per-width I/O buffers and CUDA-graph variants.

Every buffer a forward touches lives on the device at a fixed address: the
home KV block (bound as past and present), the attention mask frozen at
[1, capacity] (so `total_sequence_length` never changes and `seqlens_k` comes
from the mask), and each variant's input and logits buffers. A variant is a
captured graph (CUDA EP `enable_cuda_graph`, run option `gpu_graph_id`): the
first forward at its width captures it, later ones replay it. onnxruntime
cannot release a single graph, so variants are not evictable: the cache
refuses a width it cannot keep, and the engine runs it eagerly here.
The bytes each capture holds are the device's free memory before minus after.
Logits stay on the device: rows are cut and greedy tokens chosen there, so a
decode step moves one token id to the host.

The same code runs on the CPU provider with numpy buffers (`host_runtime`),
which is how the CPU tests cover swaps, rewinds and eager fallbacks.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnxruntime as ort
import structlog

from engine.executor.cpu import _dtype, resolve_dims
from engine.executor.cuda_runtime import CudaUnavailable, Runtime, cuda_runtime, host_runtime
from engine.executor.options import EngineOptions
from engine.executor.resident import Home, ResidentSlot
from engine.executor.sampling import Sampler
from engine.executor.variants import VariantKey
from engine.model import ModelInfo

log = structlog.get_logger("ladder.engine")

EAGER = -1  # onnxruntime's gpu_graph_id for "run without capture or replay"
__all__ = ["CudaBackend", "CudaUnavailable", "Runtime", "cuda_runtime", "host_runtime"]


@dataclass
class DeviceVariant:
    key: VariantKey
    graph_id: int
    inputs: dict[str, Any]
    logits: Any
    binding: Any
    held_bytes: int = 0  # device memory the capture took and keeps
    capture_ms: float = 0.0
    captured: bool = False
    buffers: list[Any] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        own = sum(int(a.nbytes) for a in self.inputs.values()) + int(self.logits.nbytes)
        return own + self.held_bytes

    def release(self) -> None:
        # The buffers go; a captured graph stays with the onnxruntime session until it closes.
        self.binding = None


@dataclass
class Lookahead:
    """A decode step launched before the host read its input token: the one `choose` just picked."""

    slot: ResidentSlot
    variant: DeviceVariant
    past: int
    token: int = -1

    def matches(self, variant: DeviceVariant, slot: ResidentSlot, past: int, feed: np.ndarray,
                extra: bool) -> bool:
        return (variant is self.variant and slot is self.slot and past == self.past and not extra
                and feed.size == 1 and int(feed.reshape(-1)[0]) == self.token)


class CudaBackend:
    name = "cuda"
    evictable = False  # onnxruntime cannot release one captured graph

    def __init__(self, info: ModelInfo, options: EngineOptions, runtime: Runtime | None = None) -> None:
        if info.recurrent_state:
            raise CudaUnavailable("decoders with recurrent state are not supported on the CUDA backend")
        self.info = info
        self.rt = runtime or cuda_runtime(options)
        self.xp = self.rt.xp
        so = ort.SessionOptions()
        so.log_severity_level = 3
        model = info.path / info.config["model"]["decoder"].get("filename", "model.onnx")
        before = self.rt.free_bytes()
        self.session = ort.InferenceSession(str(model), so, providers=self.rt.providers)
        self.weights_bytes = max(0, before - self.rt.free_bytes())
        self.home: Home | None = None
        self.slots: list[ResidentSlot] = []
        self._graph_ids = itertools.count(1)
        self._run_options: dict[int, Any] = {}
        self.captures = 0
        self.profile = False  # when set, the wall time spent inside onnxruntime's run is summed
        self.run_ms = 0.0
        self.profiled_forwards = 0
        # Greedy decode loops launch the next step before reading the token (CUDA only by default).
        self.lookahead = self.rt.device == "cuda"
        self._ahead: Lookahead | None = None
        self._decode: DeviceVariant | None = None
        self._recent: tuple[tuple[int, int], ...] = ()  # (slot serial, width) of the last two forwards
        self.lookahead_hits = self.lookahead_misses = 0
        if self.rt.device == "cuda":
            name = self.xp.cuda.runtime.getDeviceProperties(self.rt.device_id)["name"]
            log.info("cuda_backend", device=name.decode() if isinstance(name, bytes) else name,
                     graphs=self.rt.graphs, weights_bytes=self.weights_bytes)

    # -- slots ----------------------------------------------------------------------
    def new_slot(self, capacity: int) -> ResidentSlot:
        info = self.info
        if self.home is None:
            with self.rt.enter():
                self.home = Home(self.xp, info.num_layers, info.num_kv_heads, capacity,
                                 info.head_size, _dtype(info.kv_dtype), self.rt.host_zeros)
                self.home.settle = self._settle
        if capacity != self.home.capacity:
            raise ValueError(f"every slot shares the home's capacity {self.home.capacity}")
        slot = ResidentSlot(self.home)
        self.slots.append(slot)
        return slot

    # -- variants -------------------------------------------------------------------
    def prepare(self, key: VariantKey) -> DeviceVariant:
        graph_id = next(self._graph_ids) if self.rt.graphs else EAGER
        variant = self._variant(key, graph_id)
        if key.width == 1 and not key.ports:
            self._decode = variant
        return variant

    def _variant(self, key: VariantKey, graph_id: int) -> DeviceVariant:
        info, w, xp = self.info, key.width, self.xp
        assert self.home is not None, "open a session before running a forward"
        with self.rt.enter():
            # Inputs live in host memory the device reads in place: writing one is a host store.
            zeros = self.rt.host_zeros
            inputs = {info.feed.name: zeros(resolve_dims(info.feed, w) or (1, w), _dtype(info.feed.dtype))}
            for port in info.supplied_ports:
                if port.name in key.ports:
                    inputs[port.name] = zeros(resolve_dims(port, w) or (), _dtype(port.dtype))
            if info.position_ids:
                inputs[info.position_ids] = zeros((1, w), np.int64)
            logits_shape = resolve_dims(info.logits, w)
            if logits_shape is None:
                raise CudaUnavailable(f"logits shape {info.logits.dims} is not fixed by the query width")
            logits = xp.zeros(logits_shape, _dtype(info.logits.dtype))
        binding = self.session.io_binding()
        variant = DeviceVariant(key, graph_id, inputs, logits, binding)
        for name, array in inputs.items():
            self._bind(binding.bind_input, name, array)
        self._bind(binding.bind_output, "logits", logits)
        self._bind(binding.bind_input, info.mask, self.home.mask)
        for i, (names_in, names_out) in enumerate(zip(info.kv_inputs, info.kv_outputs, strict=True)):
            for which, (name_in, name_out) in enumerate(zip(names_in, names_out, strict=True)):
                # Past and present share one buffer at capacity: no copy per step.
                self._bind(binding.bind_input, name_in, self.home.layer(i, which))
                self._bind(binding.bind_output, name_out, self.home.layer(i, which))
        return variant

    def _bind(self, bind: Any, name: str, array: Any) -> None:
        bind(name, self.rt.device, self.rt.device_id, array.dtype, list(array.shape), self.rt.ptr(array))

    # -- forwards -------------------------------------------------------------------
    def run(self, variant: DeviceVariant, slot: ResidentSlot, past: int, feed: np.ndarray,
            ports: Mapping[str, np.ndarray], constants: Mapping[str, np.ndarray]) -> Any:
        """One forward at the variant's width; returns device logits [1, rows_returned, vocab]."""
        assert self.home is not None and variant.binding is not None
        width = variant.key.width
        ahead, self._ahead = self._ahead, None
        self._recent = (*self._recent[-1:], (slot.serial, width))
        if ahead is not None:
            self._settle()  # the looked-ahead step may still run on onnxruntime's stream
            if ahead.matches(variant, slot, past, feed, bool(ports or constants)):
                self.lookahead_hits += 1
                return variant.logits  # already queued on the stream by `choose`
            self.lookahead_misses += 1
        with self.rt.enter():
            self.home.make_resident(slot)
            self.rt.upload(variant.inputs[self.info.feed.name], feed)
            for name, array in ports.items():
                self.rt.upload(variant.inputs[name], array)
            for name, array in constants.items():
                self._constant(variant, name, array)
            if self.info.position_ids:
                variant.inputs[self.info.position_ids][0] = np.arange(past, past + width)
            self.home.set_mask(past)
            self.home.set_mask(past + width)
            self._execute(variant)
        return variant.logits

    def run_eager(self, slot: ResidentSlot, past: int, feed: np.ndarray,
                  ports: Mapping[str, np.ndarray], constants: Mapping[str, np.ndarray]) -> Any:
        """A width the variant cache would not keep: fresh buffers, no capture."""
        variant = self._variant(VariantKey(feed.shape[1], tuple(sorted(ports))), EAGER)
        return self.run(variant, slot, past, feed, ports, constants)

    def _constant(self, variant: DeviceVariant, name: str, array: np.ndarray) -> None:
        buffer = variant.inputs.get(name)
        if buffer is None:
            # First use: give the constant a fixed address before the graph is captured.
            buffer = variant.inputs[name] = self.rt.host_zeros(array.shape, array.dtype)
            self._bind(variant.binding.bind_input, name, buffer)
        self.rt.upload(buffer, array)

    def _options(self, graph_id: int, wait: bool) -> Any:
        options = self._run_options.get((graph_id, wait))
        if options is None:
            options = self._run_options[(graph_id, wait)] = ort.RunOptions()
            if self.rt.graphs:
                options.add_run_config_entry("gpu_graph_id", str(graph_id))
            if not wait:
                options.add_run_config_entry("disable_synchronize_execution_providers", "1")
        return options

    def _execute(self, variant: DeviceVariant, wait: bool = True) -> None:
        """Run the forward once cupy's queue is done; `wait` returns only when it has finished."""
        capturing = variant.graph_id != EAGER and not variant.captured
        before = self.rt.free_bytes() if capturing else 0
        assert self.home is not None
        if self.home.queued:
            self.rt.wait_queue()  # KV swap copies go first
            self.home.queued = False
        start = time.perf_counter()
        self.session.run_with_iobinding(variant.binding, self._options(variant.graph_id, wait))
        if self.profile and wait:
            self.run_ms += (time.perf_counter() - start) * 1e3
            self.profiled_forwards += 1
        if capturing:
            variant.held_bytes = max(0, before - self.rt.free_bytes())
            variant.captured = True
            self.captures += 1
            log.info("graph_captured", width=variant.key.width, graph_id=variant.graph_id,
                     held_bytes=variant.held_bytes)

    # -- logits -----------------------------------------------------------------------
    def to_host(self, logits: Any) -> np.ndarray:
        with self.rt.enter():
            return self.rt.to_host(logits)

    def choose(self, row: Any, sampler: Sampler, history: Sequence[int]) -> int:
        """The next token from one device logits row; greedy (and its penalty) never leaves the device."""
        params = sampler.params
        if not params.greedy:
            # Seeded sampling draws on the host from this one row, exactly as on CPU.
            return sampler(self.to_host(row), history)
        with self.rt.enter():
            if params.repetition_penalty != 1.0 and history:
                row = self._penalize(row, history, params.repetition_penalty)
            token = int(self.xp.argmax(row))
            if self._may_look_ahead(params.repetition_penalty):
                self._launch_ahead(token)
            return token

    def _settle(self) -> None:
        """Wait for a forward launched without waiting (a lookahead) before touching what it reads."""
        if self.home is not None and self.home.in_flight:
            self.home.in_flight = False
            self.rt.wait_device()

    def _may_look_ahead(self, penalty: float) -> bool:
        """Only inside a greedy decode loop: the last two forwards were single rows of the resident slot."""
        home, decode = self.home, self._decode
        if not self.lookahead or penalty != 1.0 or home is None or home.resident is None:
            return False
        if decode is None or decode.binding is None or self.info.supplied_ports or self.info.position_ids:
            return False
        slot = home.resident
        reach = min(home.capacity, self.info.rotary_rows or home.capacity)
        return (self._recent == ((slot.serial, 1), (slot.serial, 1)) and home.mask_len == slot.length
                and slot.length + 1 <= reach)

    def _launch_ahead(self, token: int) -> None:
        """Launch the next decode step on `token` and return without waiting for it.

        The host goes on with the caller's work while the device runs the step; the
        next `run` finds it done (a hit) when the caller feeds exactly this token.

        If the caller feeds another token, session or length instead, the step is simply
        dropped: it wrote KV past the logical length, which the mask hides and the next
        forward overwrites, exactly like a padded row.
        """
        assert self.home is not None and self._decode is not None and self.home.resident is not None
        slot, decode = self.home.resident, self._decode
        self.rt.upload(decode.inputs[self.info.feed.name], np.array([[token]]))
        self.home.set_mask(slot.length + 1)
        self._execute(decode, wait=False)
        self.home.in_flight = True
        self._ahead = Lookahead(slot, decode, slot.length, token)

    def _penalize(self, row: Any, history: Sequence[int], penalty: float) -> Any:
        xp = self.xp
        out = row.astype(xp.float32)
        seen = xp.asarray(np.unique(np.asarray(history, dtype=np.int64)))
        values = out[seen]
        out[seen] = xp.where(values > 0, values / penalty, values * penalty)
        return out

    # -- accounting -------------------------------------------------------------------
    def memory(self) -> dict[str, int]:
        """Device bytes by owner: what the memory budget adds up (weights + KV + variants)."""
        home = 0 if self.home is None else int(self.home.block.nbytes + self.home.mask.nbytes)
        parked = 0 if self.home is None else self.home.parked_bytes(self.slots)
        return {"weights": self.weights_bytes, "kv_home": home, "kv_parked": parked,
                "captures": self.captures, "lookahead_hits": self.lookahead_hits,
                "lookahead_misses": self.lookahead_misses,
                "swaps": 0 if self.home is None else self.home.swaps,
                "swapped_positions": 0 if self.home is None else self.home.swapped_positions}
