"""The CPU backend: one onnxruntime session, KV slots at capacity, variants as reusable bindings.

A KV slot holds every layer's key and value at physical capacity, bound as
both past and present (one shared buffer, so nothing is copied per step),
and an attention mask frozen at [1, capacity]: `total_sequence_length` never
changes and `seqlens_k` (sum of the mask - 1) carries the true length.
A variant holds the input and logits buffers of one query width and an
IOBinding over them; switching sessions only rebinds the slot's buffers.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

from engine.executor.options import EngineOptions
from engine.executor.variants import VariantKey
from engine.model import ModelInfo, Port

_serials = itertools.count(1)


def _dtype(name: str) -> np.dtype:
    return np.dtype(np.float16 if name == "float16" else name)


def resolve_dims(port: Port, width: int) -> tuple[int, ...] | None:
    """A port's concrete shape at query width `width`; None if a dimension stays unknown."""
    named = {"batch_size": 1, "batch": 1, "sequence_length": width}
    dims = [d if isinstance(d, int) else named.get(d) for d in port.dims]
    return None if any(d is None for d in dims) else tuple(int(d) for d in dims if d is not None)


@dataclass
class CpuSlot:
    """One session's KV cache, mask and recurrent state, allocated at capacity."""

    capacity: int
    kv: list[tuple[np.ndarray, np.ndarray]]
    mask: np.ndarray
    states: dict[str, np.ndarray]
    serial: int = field(default_factory=lambda: next(_serials))

    def __post_init__(self) -> None:
        self.kv_values = [tuple(ort.OrtValue.ortvalue_from_numpy(a) for a in pair)
                          for pair in self.kv]
        self.mask_value = ort.OrtValue.ortvalue_from_numpy(self.mask)
        self.state_out = {name: np.zeros_like(a) for name, a in self.states.items()}

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.kv) + self.mask.nbytes

    def set_length(self, length: int) -> None:
        """Make the mask say `length` valid tokens: ones before, zeros after."""
        self.mask[0, :length] = 1
        self.mask[0, length:] = 0

    def clear_state(self) -> None:
        for array in self.states.values():
            array.fill(0)


@dataclass
class CpuVariant:
    key: VariantKey
    feed: np.ndarray
    ports: dict[str, np.ndarray]
    logits: np.ndarray | None
    positions: np.ndarray | None
    binding: ort.IOBinding | None
    held: list[ort.OrtValue]
    bound_slot: int = 0

    @property
    def nbytes(self) -> int:
        arrays = [self.feed, *self.ports.values(), self.logits, self.positions]
        return sum(a.nbytes for a in arrays if a is not None)

    def release(self) -> None:
        self.binding = None
        self.held.clear()


class CpuBackend:
    name = "cpu"

    def __init__(self, info: ModelInfo, options: EngineOptions) -> None:
        self.info = info
        so = ort.SessionOptions()
        if options.intra_op_threads:
            so.intra_op_num_threads = options.intra_op_threads
        so.log_severity_level = 3
        model = info.path / info.config["model"]["decoder"].get("filename", "model.onnx")
        self.session = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])

    def new_slot(self, capacity: int) -> CpuSlot:
        info = self.info
        shape = (1, info.num_kv_heads, capacity, info.head_size)
        dtype = _dtype(info.kv_dtype)
        kv = [(np.zeros(shape, dtype), np.zeros(shape, dtype)) for _ in info.kv_inputs]
        states = {p.name: np.zeros(resolve_dims(p, 1) or (), _dtype(p.dtype))
                  for p, _ in info.state_ports}
        return CpuSlot(capacity, kv, np.zeros((1, capacity), np.int64), states)

    def prepare(self, key: VariantKey) -> CpuVariant:
        info, w = self.info, key.width
        feed_shape = resolve_dims(info.feed, w) or (1, w)
        feed = np.zeros(feed_shape, _dtype(info.feed.dtype))
        ports = {p.name: np.zeros(resolve_dims(p, w) or (), _dtype(p.dtype))
                 for p in info.supplied_ports if p.name in key.ports}
        logits_shape = resolve_dims(info.logits, w)
        logits = None if logits_shape is None else np.zeros(logits_shape,
                                                            _dtype(info.logits.dtype))
        positions = np.zeros((1, w), np.int64) if info.position_ids else None
        binding = self.session.io_binding()
        # OrtValues over numpy buffers share their memory: a copy into the buffer is the bind.
        held = []
        for name, array in [(info.feed.name, feed), *ports.items(), ("position_ids", positions)]:
            if array is not None:
                held.append(ort.OrtValue.ortvalue_from_numpy(array))
                binding.bind_ortvalue_input(name, held[-1])
        if logits is None:
            binding.bind_output("logits", "cpu")
        else:
            held.append(ort.OrtValue.ortvalue_from_numpy(logits))
            binding.bind_ortvalue_output("logits", held[-1])
        return CpuVariant(key, feed, ports, logits, positions, binding, held)

    def _bind_slot(self, variant: CpuVariant, slot: CpuSlot) -> None:
        assert variant.binding is not None
        if variant.bound_slot != slot.serial:
            variant.binding.bind_ortvalue_input(self.info.mask, slot.mask_value)
            for names_in, names_out, values in zip(self.info.kv_inputs, self.info.kv_outputs,
                                                   slot.kv_values, strict=True):
                for name_in, name_out, value in zip(names_in, names_out, values, strict=True):
                    # Past and present share one buffer at capacity: no copy per step.
                    variant.binding.bind_ortvalue_input(name_in, value)
                    variant.binding.bind_ortvalue_output(name_out, value)
            variant.bound_slot = slot.serial
        for port, out_name in self.info.state_ports:
            # State is read and rewritten by one forward: in and out are two buffers.
            variant.binding.bind_cpu_input(port.name, slot.states[port.name])
            variant.binding.bind_ortvalue_output(
                out_name, ort.OrtValue.ortvalue_from_numpy(slot.state_out[port.name]))

    def run(self, variant: CpuVariant, slot: CpuSlot, past: int, feed: np.ndarray,
            ports: Mapping[str, np.ndarray], constants: Mapping[str, np.ndarray]) -> np.ndarray:
        """One forward at the variant's width; returns logits [1, rows_returned, vocab]."""
        assert variant.binding is not None
        width = variant.key.width
        np.copyto(variant.feed, feed.reshape(variant.feed.shape))
        for name, array in ports.items():
            np.copyto(variant.ports[name], array)
        if variant.positions is not None:
            variant.positions[0] = np.arange(past, past + width)
        slot.mask[0, past:past + width] = 1
        self._bind_slot(variant, slot)
        for name, array in constants.items():
            variant.binding.bind_cpu_input(name, array)
        self.session.run_with_iobinding(variant.binding)
        for port, _ in self.info.state_ports:
            name = port.name
            slot.states[name], slot.state_out[name] = slot.state_out[name], slot.states[name]
        if variant.logits is not None:
            return variant.logits
        # Logits were bound first, so they are the first output of the binding.
        return np.asarray(variant.binding.get_outputs()[0].numpy())
