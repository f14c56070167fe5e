"""Can the host launch a decode forward as a CUDA graph of its own, and sleep through most of it?

Issue #42's last target (the core's process <= 1.0 core at saturation) meets a wall in
onnxruntime: its CUDA provider waits for the stream inside every graph replay, so the engine
thread either spins through the whole forward (a core) or sleeps and wakes 30-85 us late
(bench/results/cuda-wait-h100-2026-12-06). A launch that returns once queued would let the host
sleep for most of the forward's known length and spin only for its end. This probe asks whether
onnxruntime's eager run of one B-row decode step, on our cupy stream with its end-of-run sync off,
can be captured by cupy's stream capture into a graph we launch ourselves, and what that costs.

One B-row decode step (KV shared past/present, as bench/batching.py's raw replay), each way, the
same buffers, STEPS steps after a warm-up:
- ort-replay: onnxruntime's own captured graph (`gpu_graph_id`), its replay waiting inside, under
  the context's schedule as made (spin): the server's path today;
- ort-toggled: the same, with the context set to BLOCKING_SYNC around each replay
  (engine/runtime/cuda_runtime.py's `ReplayWait`, i.e. `--cuda-wait replay`);
- ort-blocking: the same, the context BLOCKING_SYNC throughout (set once), so the replay's wait
  sleeps while the step's own event (made without `block=True`) still spins: what `replay` would
  cost without its two driver calls a forward;
- own-spin: the eager run captured once (cupy `Stream.begin_capture`/`end_capture`), then each step
  `Graph.launch` and the stream waited for, spinning;
- own-sleep: the same launch, then `time.sleep` for the last steps' median forward less MARGIN,
  then the spinning wait.
Per way: wall and the host thread's CPU per step, the device's time per step (events around the
launch), and whether the logits equal onnxruntime's own replay's bit for bit. A failed capture is
recorded with its error (what onnxruntime does inside a run that a capture cannot hold).

    python3 -m bench.gpu.own_graph --out $OUT [--rows 64,128] [--model 16x2048]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from bench.batching import bind_decode_step, decode_buffers
from bench.gpu.run import build


def timed_steps(cp: Any, stream: Any, step: Any, steps: int) -> dict[str, float]:
    """Mean wall, host-thread CPU and device time per step (events recorded around each)."""
    walls, cpus, device = [], [], []
    begin, end = cp.cuda.Event(), cp.cuda.Event()
    for _ in range(steps):
        wall, cpu = time.perf_counter(), time.thread_time()
        begin.record(stream)
        step(end)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.thread_time() - cpu)
        device.append(cp.cuda.get_elapsed_time(begin, end) * 1e3)
    return {
        "wall_us": 1e6 * statistics.fmean(walls),
        "cpu_us": 1e6 * statistics.fmean(cpus),
        "device_us": statistics.fmean(device),
        "wall_p99_us": 1e6 * sorted(walls)[int(0.99 * (len(walls) - 1))],
    }


def probe(path: Path, rows: int, capacity: int, past: int, steps: int, margin_us: float) -> dict[str, Any]:
    import cupy as cp
    import onnxruntime as ort

    from engine.model import load_model_info
    from engine.runtime.cuda_runtime import ReplayWait

    info = load_model_info(path)
    stream = cp.cuda.Stream(non_blocking=True)
    out: dict[str, Any] = {"rows": rows, "capacity": capacity, "past": past, "steps": steps}
    with stream:
        ort_buffers = decode_buffers(cp, info, rows, capacity, past)
        # The eager run's binding: the same inputs and KV, its own logits.
        own_buffers = {**ort_buffers, "logits": cp.zeros_like(ort_buffers["logits"])}
        logits = {"ort": ort_buffers["logits"], "own": own_buffers["logits"]}
        stream.synchronize()

        def warmed(graphs: bool, buffers: dict[str, Any], entry: tuple[str, str]) -> tuple[Any, Any, Any]:
            """A session (onnxruntime's graphs or eager), its binding of `buffers` and its run
            options (`entry`), run five times."""
            cuda = {
                "enable_cuda_graph": "1" if graphs else "0",
                "user_compute_stream": str(stream.ptr),
                "arena_extend_strategy": "kSameAsRequested",
            }
            made = ort.InferenceSession(str(info.graph), providers=[("CUDAExecutionProvider", cuda)])
            binding = bind_decode_step(made, info, buffers)
            options = ort.RunOptions()
            options.add_run_config_entry(*entry)
            for _ in range(5):
                made.run_with_iobinding(binding, options)
            stream.synchronize()
            return made, binding, options

        # onnxruntime's own graph: the step writes the same KV position each time (the masks do
        # not move), so every step gives the same logits.
        replayed, ort_binding, ort_options = warmed(True, ort_buffers, ("gpu_graph_id", "1"))

        def ort_step(end: Any) -> None:
            replayed.run_with_iobinding(ort_binding, ort_options)
            end.record(stream)
            end.synchronize()

        out["ort-replay"] = timed_steps(cp, stream, ort_step, steps)
        wait = ReplayWait.current()
        if wait is not None:

            def ort_block(end: Any) -> None:
                wait.sleep()
                try:
                    replayed.run_with_iobinding(ort_binding, ort_options)
                finally:
                    wait.spin()
                end.record(stream)
                end.synchronize()

            out["ort-toggled"] = timed_steps(cp, stream, ort_block, steps)
            wait.sleep()
            try:
                out["ort-blocking"] = timed_steps(cp, stream, ort_step, steps)
            finally:
                wait.spin()
        else:
            out["ort-toggled"] = out["ort-blocking"] = {"error": "the driver has no cuCtxSetFlags"}

        # The eager run, captured by us.
        eager, own_binding, no_sync = warmed(
            False, own_buffers, ("disable_synchronize_execution_providers", "1")
        )
        out["eager_equal"] = bool(cp.array_equal(logits["ort"], logits["own"]))
        logits["own"].fill(0)
        stream.synchronize()
        try:
            mode = getattr(cp.cuda.runtime, "streamCaptureModeRelaxed", None)
            stream.begin_capture(*(() if mode is None else (mode,)))
            try:
                eager.run_with_iobinding(own_binding, no_sync)
            finally:
                graph = stream.end_capture()
            graph.launch(stream)
            stream.synchronize()
        except Exception as exc:  # noqa: BLE001 — the probe's answer: what a capture cannot hold
            out["capture_error"] = f"{type(exc).__name__}: {exc}"
            return out
        out["own_equal"] = bool(cp.array_equal(logits["ort"], logits["own"]))
        apart = logits["ort"].astype(cp.float32) - logits["own"].astype(cp.float32)
        out["own_max_diff"] = float(cp.abs(apart).max())

        def own_spin(end: Any) -> None:
            graph.launch(stream)
            end.record(stream)
            end.synchronize()  # a cupy event without block=True spins

        for _ in range(10):
            own_spin(cp.cuda.Event())
        out["own-spin"] = timed_steps(cp, stream, own_spin, steps)
        expected = out["own-spin"]["device_us"]
        sleep_s = max(0.0, (expected - margin_us) / 1e6)

        def own_sleep(end: Any) -> None:
            graph.launch(stream)
            end.record(stream)
            time.sleep(sleep_s)
            end.synchronize()

        out["own-sleep"] = timed_steps(cp, stream, own_sleep, steps)
        out["own-sleep"]["slept_us"] = sleep_s * 1e6
        own_spin(cp.cuda.Event())
        out["own_equal_after"] = bool(cp.array_equal(logits["ort"], logits["own"]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="16x2048")
    parser.add_argument("--rows", default="64,128")
    parser.add_argument("--capacity", type=int, default=1024)
    parser.add_argument("--past", type=int, default=512)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--margin-us", type=float, default=150.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    path = build(args.model, Path("/tmp/ladder-gpu-models"))
    result: dict[str, Any] = {"model": args.model, "margin_us": args.margin_us, "runs": []}
    for rows in [int(r) for r in args.rows.split(",")]:
        run = probe(path, rows, args.capacity, args.past, args.steps, args.margin_us)
        result["runs"].append(run)
        print(json.dumps(run), flush=True)
        (args.out / "own_graph.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
