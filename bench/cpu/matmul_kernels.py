"""onnxruntime's CPU kernels for one prefill-sized and one decode-sized linear layer of SmolLM2
(K 576 → N 1536 and K 1536 → N 576; M 512 rows, then 1), two threads: MatMulNBits 4-bit (block 32,
zero points) at each accuracy level and at level 4 with float zero points (Q4_1's offsets exactly),
fp32 MatMul, and DynamicQuantizeMatMul (int8 weights per column, the kernel MLAS runs on AMX where
the CPU has it). Random weights: the times, and for the 4-bit kernels the largest error against the
float64 product of the weights they stand for (int8 activations show there).

    python -m bench.cpu.matmul_kernels [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from onnx import ModelProto, TensorProto, helper, numpy_helper

from bench.served import machine

RNG = np.random.default_rng(0)
BLOCK = 32


def single_node(op: str, inputs: dict[str, np.ndarray], m: int, n: int, **attributes: Any) -> ModelProto:
    node = helper.make_node(
        op, ["A", *inputs], ["Y"], domain="" if op == "MatMul" else "com.microsoft", **attributes
    )
    graph = helper.make_graph(
        [node],
        op,
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [m, None])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [m, n])],
        [numpy_helper.from_array(v, k) for k, v in inputs.items()],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )


def dequantized(b: np.ndarray, scales: np.ndarray, zero: np.ndarray, k: int, n: int) -> np.ndarray:
    """The [K, N] float64 weights MatMulNBits' inputs stand for: scale · (q − zero point), per block."""
    blocks = k // BLOCK
    q = np.stack([b & 0x0F, b >> 4], axis=-1).reshape(n, blocks, BLOCK).astype(np.float64)
    if zero.dtype == np.uint8:  # two 4-bit zero points a byte, blocks padded to an even count
        packed = zero.reshape(n, -1)
        zero = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, -1)[:, :blocks]
    scale = scales.reshape(n, blocks, 1).astype(np.float64)
    return (scale * (q - zero.reshape(n, blocks, 1).astype(np.float64))).reshape(n, k).T


def session_of(model: ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def ms_per_run(model: ModelProto, a: np.ndarray) -> float:
    session = session_of(model)
    runs = 20 if a.shape[0] > 1 else 2000
    for _ in range(3):
        session.run(None, {"A": a})
    started = time.perf_counter()
    for _ in range(runs):
        session.run(None, {"A": a})
    return (time.perf_counter() - started) / runs * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for m, k, n in ((512, 576, 1536), (512, 1536, 576), (1, 576, 1536), (1, 1536, 576)):
        a = RNG.standard_normal((m, k)).astype(np.float32)
        nbits = {
            "B": RNG.integers(0, 255, (n, k // BLOCK, BLOCK // 2)).astype(np.uint8),
            "S": (RNG.random(n * k // BLOCK) * 0.02).astype(np.float32),
            "Z": RNG.integers(0, 255, n * ((k // BLOCK + 1) // 2)).astype(np.uint8),
        }
        kernels = {
            f"MatMulNBits accuracy_level={level}": single_node(
                "MatMulNBits", nbits, m, n, K=k, N=n, bits=4, block_size=BLOCK, accuracy_level=level
            )
            for level in range(5)
        }
        # Q4_1's block offsets exactly: w = d·q + m = d·(q − zp) with a float zero point zp = −m/d.
        offsets = (RNG.standard_normal(n * k // BLOCK) * 0.01).astype(np.float32)
        q41 = {**nbits, "Z": (-offsets / nbits["S"]).astype(np.float32)}
        kernels["MatMulNBits level 4, float zero points"] = single_node(
            "MatMulNBits", q41, m, n, K=k, N=n, bits=4, block_size=BLOCK, accuracy_level=4
        )
        # The float64 weights each 4-bit kernel stands for (its error is measured against their product).
        plain, offset = (dequantized(w["B"], w["S"], w["Z"], k, n) for w in (nbits, q41))
        exact = {name: offset if "float zero" in name else plain for name in kernels}
        fp32 = RNG.standard_normal((k, n)).astype(np.float32)
        kernels["MatMul fp32"] = single_node("MatMul", {"W": fp32}, m, n)
        kernels["DynamicQuantizeMatMul int8"] = single_node(
            "DynamicQuantizeMatMul",
            {"W": RNG.integers(-127, 127, (k, n)).astype(np.int8), "scale": np.full((n,), 0.01, np.float32)},
            m,
            n,
        )
        for name, model in kernels.items():
            ms = ms_per_run(model, a)
            rows.append(
                {
                    "m": m,
                    "k": k,
                    "n": n,
                    "kernel": name,
                    "ms": round(ms, 4),
                    "gops": round(2 * m * k * n / ms / 1e6, 1),
                }
            )
            error = ""
            if name in exact:  # the largest error against the float64 product, over its largest value
                reference = a.astype(np.float64) @ exact[name]
                got = session_of(model).run(None, {"A": a})[0]
                relative = float(np.abs(got - reference).max() / np.abs(reference).max())
                rows[-1]["max_error_over_max"] = relative
                error = f"  error/max {relative:.1e}"
            print(
                f"M={m:3d} K={k:4d} N={n:4d} {name:38s} {ms:8.3f} ms {rows[-1]['gops']:8.1f} GOPS{error}",
                flush=True,
            )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        result = {"machine": machine(), "rows": rows}
        (args.out / "matmul-kernels.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
