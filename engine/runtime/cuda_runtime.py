"""Where the CUDA backend's buffers live: cupy on one CUDA stream shared with onnxruntime, or numpy.

`cuda_runtime` gives cupy a stream of its own and offers it to onnxruntime's CUDA
provider (`user_compute_stream`), which runs its forwards on it (measured on the
H200 with onnxruntime-gpu 1.31.1, graph replays included: bench/gpu/stream_order.py).
The decode chain relies on that order (CudaBackend.chain_batch); every other path
finishes cupy's queue before a forward and the forward before cupy reads what it
wrote, as written before the order was measured. Small inputs live in pinned host memory the device reads
in place (`host_zeros`), so the hot path writes them with plain host stores;
`host_runtime` runs the same backend code on numpy and the CPU provider, which
is how CI tests it.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort

from engine.options import EngineOptions


class CudaUnavailable(RuntimeError):
    """No usable CUDA device, cupy or onnxruntime CUDA provider: the engine falls back to CPU."""


@dataclass
class Placement:
    """Where buffers live and how onnxruntime sees them: cupy on a CUDA stream, or numpy on the host."""

    xp: Any
    device: str  # onnxruntime's name for the memory: "cuda" or "cpu"
    device_id: int
    providers: list[Any]
    graphs: bool
    stream: Any = None
    blocking: bool = False  # the host sleeps while it waits for the device (EngineOptions.cuda_wait)
    replay_wait: ReplayWait | None = None  # "replay": the host sleeps in captured forwards alone

    @property
    def waits(self) -> str:
        """How the host waits for the device, as taken ("spin" where the driver refused the rest)."""
        return "block" if self.blocking else "replay" if self.replay_wait is not None else "spin"

    def ptr(self, array: Any) -> int:
        return int(array.ctypes.data) if isinstance(array, np.ndarray) else int(array.data.ptr)

    def host_zeros(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """A host array the device reads in place: pinned memory, same address on both (UVA).

        Small per-forward inputs (token ids, the attention mask) live here, so writing
        them is a plain store on the host: no copy, no kernel, no stream to wait for.
        """
        dtype = np.dtype(dtype)
        if self.device != "cuda":
            return np.zeros(shape, dtype)
        count = int(np.prod(shape, dtype=np.int64))
        memory = self.xp.cuda.alloc_pinned_memory(max(count, 1) * dtype.itemsize)
        array = np.frombuffer(memory, dtype, count).reshape(shape)
        array.fill(0)
        return array

    def upload(self, buffer: Any, host: np.ndarray) -> None:
        host = np.ascontiguousarray(host, dtype=buffer.dtype).reshape(buffer.shape)
        if isinstance(buffer, np.ndarray):
            np.copyto(buffer, host)
        else:
            buffer.set(host, stream=self.stream)

    def to_host(self, array: Any) -> np.ndarray:
        if self.device == "cuda":
            return self.xp.asnumpy(array, stream=self.stream)  # type: ignore[no-any-return]
        return np.array(array, copy=True)

    def copy_positions(self, dst: Any, dst_row: int, src: Any, src_row: int, start: int, stop: int) -> None:
        """dst[:, :, dst_row, :, start:stop] = src[:, :, src_row, :, start:stop] for KV blocks [layers, 2,
        rows, kv_heads, capacity, head] (the pool, or a staging block: their capacities may differ),
        queued on the backend's stream on CUDA.

        On the device a position whose bytes are a multiple of 16 moves as 16-byte words, by one
        kernel launched with the blocks' addresses (`_copy_kernel`). Element by element in fp16 (cupy's
        slice assignment) a 3B-class model's 4,000-token prefix (459 MB) took 2.2 ms on the H200, and
        the slicing alone cost ~0.2 ms of host time on every prefill forward's staging store; one
        cudaMemcpy2DAsync per layer's key or value block took 0.6 ms of host time.
        """
        if stop <= start or (dst is src and dst_row == src_row):
            return
        position_bytes = src.shape[-1] * src.dtype.itemsize
        if (
            self.device != "cuda"
            or position_bytes % 16
            or src.shape[:2] != dst.shape[:2]
            or src.shape[3] != dst.shape[3]
            or src.shape[5] != dst.shape[5]
            or src.dtype != dst.dtype
            or not (src.flags.c_contiguous and dst.flags.c_contiguous)
        ):
            dst[:, :, dst_row, :, start:stop] = src[:, :, src_row, :, start:stop]
            return
        words, (layers, pair, _, heads) = position_bytes // 16, src.shape[:4]
        count = layers * pair * heads * (stop - start) * words
        src_row_bytes = heads * src.shape[4] * position_bytes
        dst_row_bytes = heads * dst.shape[4] * position_bytes
        offset = start * position_bytes  # to the first position copied, within a row's first head
        kernel = _copy_kernel(self.xp)
        kernel(
            (min((count + 255) // 256, 65536),),
            (256,),
            (
                np.uint64(src.data.ptr + src_row * src_row_bytes + offset),
                np.uint64(dst.data.ptr + dst_row * dst_row_bytes + offset),
                np.int64(heads),
                np.int64(stop - start),
                np.int64(words),
                np.int64(src.shape[4] * words),
                np.int64(dst.shape[4] * words),
                np.int64(src.shape[2] * src_row_bytes // 16),
                np.int64(dst.shape[2] * dst_row_bytes // 16),
                np.int64(count),
            ),
        )

    def free_bytes(self) -> int:
        return int(self.xp.cuda.runtime.memGetInfo()[0]) if self.device == "cuda" else 0

    def mark(self) -> Any:
        """An event behind the work queued so far on the backend's stream; its `synchronize()`
        sleeps until the device reaches it when `blocking`, else busy-polls."""
        event = self.xp.cuda.Event(block=self.blocking, disable_timing=True)
        event.record(self.stream)
        return event

    def wait_queue(self) -> None:
        """Finish what cupy queued on the backend's stream (before onnxruntime reads it)."""
        if self.stream is not None:
            self.stream.synchronize()

    def wait_device(self) -> None:
        """Finish everything on the device, onnxruntime's own stream included."""
        if self.device == "cuda":
            self.xp.cuda.Device(self.device_id).synchronize()

    def enter(self) -> Any:
        """Context that makes the backend's stream current for cupy (a no-op on the host)."""
        return self.stream if self.stream is not None else _NullContext()


class _NullContext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def cuda_runtime(options: EngineOptions, *, graphs: bool = True) -> Placement:
    """cupy on a stream of its own that onnxruntime's CUDA provider also runs on; raises CudaUnavailable."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise CudaUnavailable("onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)")
    # Before the context is made current: onnxruntime's graph replays end in a stream wait of
    # their own, which under the default schedule spins a core for the whole forward.
    blocking = options.cuda_wait == "block" and block_on_waits(options.device_id)
    try:
        import cupy as cp

        cp.cuda.Device(options.device_id).use()
        stream = cp.cuda.Stream(non_blocking=True)
    except Exception as exc:  # ImportError, or a CUDA runtime error when there is no device
        raise CudaUnavailable(f"cupy cannot use CUDA device {options.device_id}: {exc}") from exc
    replay_wait = ReplayWait.current() if options.cuda_wait == "replay" else None
    cuda = {
        "device_id": str(options.device_id),
        "enable_cuda_graph": "1" if graphs else "0",
        "user_compute_stream": str(stream.ptr),
        "arena_extend_strategy": "kSameAsRequested",
    }
    return Placement(
        cp,
        "cuda",
        options.device_id,
        [("CUDAExecutionProvider", cuda), "CPUExecutionProvider"],
        graphs,
        stream,
        blocking=blocking,
        replay_wait=replay_wait,
    )


_CU_CTX_SCHED_BLOCKING_SYNC = 0x04


def block_on_waits(device_id: int) -> bool:
    """Make every host wait on the device's primary context sleep until the device signals
    (CU_CTX_SCHED_BLOCKING_SYNC) instead of spinning: stream and device waits, onnxruntime's own
    included (a graph replay waits for its forward: onnxruntime's cuda_graph.cc, 1.31). Set through
    the driver API (cupy has no setDeviceFlags); False, and waits keep spinning, where the driver
    refuses or is absent."""
    driver = _driver()
    if driver is None:
        return False
    device = ctypes.c_int()
    if driver.cuInit(0) != 0 or driver.cuDeviceGet(ctypes.byref(device), device_id) != 0:
        return False
    set_flags = getattr(driver, "cuDevicePrimaryCtxSetFlags_v2", None) or driver.cuDevicePrimaryCtxSetFlags
    return bool(set_flags(device, _CU_CTX_SCHED_BLOCKING_SYNC) == 0)


def _driver() -> Any:
    """The CUDA driver library (None where it is absent)."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


_CU_CTX_SCHED_MASK = 0x07


class ReplayWait:
    """Switch the device's context between sleeping and spinning waits at run time (the driver's
    `cuCtxSetFlags`, CUDA 12.1+): `sleep()` before a captured forward, whose replay ends in
    onnxruntime's own wait for the whole forward, `spin()` after it, so the short waits of a step
    (its token copy, cupy's queue) keep spinning. The schedule is the context's, so it holds for
    every thread while set; forwards run one at a time (engine/runtime/forwards.py)."""

    def __init__(self, driver: Any, context: ctypes.c_void_p, flags: int) -> None:
        self._context = context
        self._set_current = driver.cuCtxSetCurrent
        self._set_flags = driver.cuCtxSetFlags
        self._sleeping = (flags & ~_CU_CTX_SCHED_MASK) | _CU_CTX_SCHED_BLOCKING_SYNC
        self._spinning = flags  # as the context was made: the default schedule spins on a host
        # with more cores than contexts

    @classmethod
    def current(cls) -> ReplayWait | None:
        """The schedule switch of the calling thread's current context; None where the driver has
        no cuCtxSetFlags (before CUDA 12.1) or refuses: waits then keep spinning."""
        driver = _driver()
        try:
            get_current, get_flags = driver.cuCtxGetCurrent, driver.cuCtxGetFlags
            driver.cuCtxSetFlags.argtypes = [ctypes.c_uint]
            driver.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
        except AttributeError:  # no driver, or one before CUDA 12.1
            return None
        context, flags = ctypes.c_void_p(), ctypes.c_uint()
        if get_current(ctypes.byref(context)) != 0 or not context.value:
            return None
        if get_flags(ctypes.byref(flags)) != 0:
            return None
        wait = cls(driver, context, int(flags.value))
        if not wait.sleep():
            return None
        wait.spin()
        return wait

    def sleep(self) -> bool:
        """Waits on the device sleep from now on (True where the driver took it)."""
        return self._switch(self._sleeping)

    def spin(self) -> bool:
        """Waits spin again, as the context was made."""
        return self._switch(self._spinning)

    def _switch(self, flags: int) -> bool:
        # The context is made current first: a thread that has not called CUDA yet has none.
        return bool(self._set_current(self._context) == 0 and self._set_flags(flags) == 0)


def host_runtime() -> Placement:
    """numpy buffers on the CPU provider: the same bookkeeping, no graphs (for tests)."""
    return Placement(np, "cpu", 0, ["CPUExecutionProvider"], graphs=False)


_COPY_SOURCE = r"""
extern "C" __global__ void copy_kv(const ulonglong2* src, ulonglong2* dst, long long heads,
                                   long long positions, long long words, long long src_head_stride,
                                   long long dst_head_stride, long long src_block_stride,
                                   long long dst_block_stride, long long count) {
    // Element i: block b (a layer's keys or values), head h, position p, word w of the positions copied.
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < count;
         i += (long long)gridDim.x * blockDim.x) {
        long long w = i % words, rest = i / words;
        long long p = rest % positions;
        rest /= positions;
        long long h = rest % heads, b = rest / heads;
        long long within = p * words + w;
        dst[b * dst_block_stride + h * dst_head_stride + within] =
            src[b * src_block_stride + h * src_head_stride + within];
    }
}
"""
_COPY_KERNELS: dict[int, Any] = {}


def _copy_kernel(xp: Any) -> Any:
    """The KV copy kernel, compiled once per process (cupy caches the binary on disk as well)."""
    kernel = _COPY_KERNELS.get(id(xp))
    if kernel is None:
        kernel = _COPY_KERNELS[id(xp)] = xp.RawKernel(_COPY_SOURCE, "copy_kv")
    return kernel
