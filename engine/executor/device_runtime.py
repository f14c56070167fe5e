"""Where the CUDA backend's buffers live: cupy on one CUDA stream shared with onnxruntime, or numpy.

`cuda_runtime` puts cupy and onnxruntime's CUDA provider on one stream, so
mask updates, the forward, argmax and copies are ordered without host syncs;
`host_runtime` runs the same backend code on numpy and the CPU provider, which
is how CI tests it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnxruntime as ort

from engine.executor.options import EngineOptions


class CudaUnavailable(RuntimeError):
    """No usable CUDA device, cupy or onnxruntime CUDA provider: the engine falls back to CPU."""


@dataclass
class Runtime:
    """Where buffers live and how onnxruntime sees them: cupy on a CUDA stream, or numpy on the host."""

    xp: Any
    device: str  # onnxruntime's name for the memory: "cuda" or "cpu"
    device_id: int
    providers: list[Any]
    graphs: bool
    stream: Any = None
    _pinned: Any = field(default=None, repr=False)

    def ptr(self, array: Any) -> int:
        return int(array.data.ptr) if self.device == "cuda" else int(array.ctypes.data)

    def upload(self, buffer: Any, host: np.ndarray) -> None:
        host = np.ascontiguousarray(host, dtype=buffer.dtype).reshape(buffer.shape)
        if self.device == "cuda":
            buffer.set(host, stream=self.stream)
        else:
            np.copyto(buffer, host)

    def to_host(self, array: Any) -> np.ndarray:
        if self.device == "cuda":
            return self.xp.asnumpy(array, stream=self.stream)  # type: ignore[no-any-return]
        return np.array(array, copy=True)

    def free_bytes(self) -> int:
        return int(self.xp.cuda.runtime.memGetInfo()[0]) if self.device == "cuda" else 0

    def token_copy(self, choice: Any) -> Any:
        """Start moving one device scalar to the host; returns a handle for `token_wait`."""
        if self.device != "cuda":
            return int(choice)
        if self._pinned is None:
            self._pinned = self.xp.cuda.alloc_pinned_memory(8)
        host = np.frombuffer(self._pinned, np.int64, 1)
        choice.get(stream=self.stream, out=host.reshape(()), blocking=False)
        return host, self.stream.record()

    def token_wait(self, handle: Any) -> int:
        """The token of `token_copy`, waiting only for the work queued before it."""
        if isinstance(handle, int):
            return handle
        host, event = handle
        event.synchronize()
        return int(host[0])

    def enter(self) -> Any:
        """Context that makes the backend's stream current for cupy (a no-op on the host)."""
        return self.stream if self.stream is not None else _NullContext()


class _NullContext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def cuda_runtime(options: EngineOptions, *, graphs: bool = True) -> Runtime:
    """cupy on a stream of its own that onnxruntime's CUDA provider also runs on; raises CudaUnavailable."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise CudaUnavailable("onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)")
    try:
        import cupy as cp

        cp.cuda.Device(options.device_id).use()
        stream = cp.cuda.Stream(non_blocking=True)
    except Exception as exc:  # ImportError, or a CUDA runtime error when there is no device
        raise CudaUnavailable(f"cupy cannot use CUDA device {options.device_id}: {exc}") from exc
    cuda = {"device_id": str(options.device_id), "enable_cuda_graph": "1" if graphs else "0",
            # One stream for cupy and onnxruntime: mask updates and argmax are ordered with the forward.
            "user_compute_stream": str(stream.ptr), "arena_extend_strategy": "kSameAsRequested"}
    return Runtime(cp, "cuda", options.device_id,
                   [("CUDAExecutionProvider", cuda), "CPUExecutionProvider"], graphs, stream)


def host_runtime() -> Runtime:
    """numpy buffers on the CPU provider: the same bookkeeping, no graphs (for tests)."""
    return Runtime(np, "cpu", 0, ["CPUExecutionProvider"], graphs=False)
