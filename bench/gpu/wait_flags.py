"""Can the host switch how it waits for the device at run time, wait by wait?

`--cuda-wait block` sets the primary context's schedule before it is made current, so every
wait sleeps; `--cuda-wait replay` wants only onnxruntime's graph replay (a whole forward) to
sleep and the short waits around it to spin. This probe times one thread's waits for a kernel
that holds the device for a set time (a `clock64` loop on one thread), under each way of
setting the schedule, and reports per wait: the wall time past the kernel's own, and the
thread's CPU time (spinning costs the whole wait, sleeping almost none):

- spin: the context as created (the default schedule on a machine with more cores than contexts);
- ctx-block / ctx-spin: `cuCtxSetFlags` (CUDA 12.1+) on the current context;
- primary-block / primary-spin: `cuDevicePrimaryCtxSetFlags_v2` on the active primary context;
- toggle: BLOCKING_SYNC set before the launch and SPIN after the wait, every time (what a
  replay-only schedule does around each forward), the two driver calls included;
- event-in-block: a cupy event without the blocking flag, waited for while the context blocks.

    python3 -m bench.gpu.wait_flags --out $OUT
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time
from pathlib import Path
from typing import Any

SPIN, BLOCKING_SYNC = 0x01, 0x04


class Driver:
    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.device = ctypes.c_int()
        assert self.lib.cuDeviceGet(ctypes.byref(self.device), 0) == 0

    def ctx_flags(self) -> int:
        flags = ctypes.c_uint()
        code = self.lib.cuCtxGetFlags(ctypes.byref(flags))
        return int(flags.value) if code == 0 else -code

    def ctx_set(self, flags: int) -> int:
        return int(self.lib.cuCtxSetFlags(ctypes.c_uint(flags)))

    def primary_set(self, flags: int) -> int:
        return int(self.lib.cuDevicePrimaryCtxSetFlags_v2(self.device, ctypes.c_uint(flags)))


def waits(
    cp: Any,
    hold: Any,
    stream: Any,
    cycles: int,
    trials: int,
    before: Any = None,
    after: Any = None,
    event: bool = False,
) -> dict[str, float]:
    """Mean wall and thread-CPU microseconds per launch-and-wait of a kernel holding `cycles`."""
    walls, cpus = [], []
    for _ in range(trials + 3):
        wall, cpu = time.perf_counter(), time.thread_time()
        if before is not None:
            before()
        hold((1,), (1,), (cp.int64(cycles),), stream=stream)
        if event:
            mark = cp.cuda.Event(block=False, disable_timing=True)
            mark.record(stream)
            mark.synchronize()
        else:
            stream.synchronize()
        if after is not None:
            after()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.thread_time() - cpu)
    walls, cpus = walls[3:], cpus[3:]
    return {"wall_us": 1e6 * sum(walls) / trials, "cpu_us": 1e6 * sum(cpus) / trials}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--holds-ms", default="0.05,1,5")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import cupy as cp

    cp.cuda.Device(0).use()
    stream = cp.cuda.Stream(non_blocking=True)
    hold = cp.RawKernel(
        'extern "C" __global__ void hold(long long cycles) {'
        " long long start = clock64(); while (clock64() - start < cycles) {} }",
        "hold",
    )
    driver = Driver()
    khz = int(cp.cuda.runtime.getDeviceProperties(0)["clockRate"])
    result: dict[str, Any] = {"flags_at_start": driver.ctx_flags(), "clock_khz": khz, "runs": []}
    schemes: list[tuple[str, Any, dict[str, Any]]] = [
        ("spin", lambda: driver.ctx_set(SPIN), {}),
        ("ctx-block", lambda: driver.ctx_set(BLOCKING_SYNC), {}),
        ("event-in-block", lambda: driver.ctx_set(BLOCKING_SYNC), {"event": True}),
        ("ctx-spin", lambda: driver.ctx_set(SPIN), {}),
        ("primary-block", lambda: driver.primary_set(BLOCKING_SYNC), {}),
        ("primary-spin", lambda: driver.primary_set(SPIN), {}),
        (
            "toggle",
            lambda: driver.ctx_set(SPIN),
            {"before": lambda: driver.ctx_set(BLOCKING_SYNC), "after": lambda: driver.ctx_set(SPIN)},
        ),
    ]
    for name, setup, extra in schemes:
        code = setup()
        flags = driver.ctx_flags()
        for hold_ms in [float(x) for x in args.holds_ms.split(",")]:
            cycles = int(hold_ms * khz)
            row = waits(cp, hold, stream, cycles, args.trials, **extra)
            row.update(scheme=name, set_code=code, flags=flags, hold_ms=hold_ms)
            row["over_us"] = row["wall_us"] - 1000 * hold_ms
            result["runs"].append(row)
            print(
                f"{name:15} set={code} flags={flags:#x} hold {hold_ms:5.2f} ms: "
                f"wall {row['wall_us']:8.1f} us (+{row['over_us']:6.1f}) cpu {row['cpu_us']:8.1f} us",
                flush=True,
            )
    driver.ctx_set(SPIN)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "wait_flags.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
