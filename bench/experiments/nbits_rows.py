"""Issue #44: does MatMulNBits give a row the same bits whatever the row count?

One MatMulNBits node (random 4- or 8-bit weights in blocks of 32, K 576) run on 1 row and on the
same row among 2, 3, 5 and 9, at accuracy levels 0 and 4, on 1 and 2 intra-op threads: the largest
difference of row 0 against the lone row, for each N.

    python -m bench.experiments.nbits_rows [--out FILE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

K, BLOCK = 576, 32


def node_model(n: int, bits: int, level: int, rng: np.random.Generator) -> bytes:
    blocks = K // BLOCK
    packed = rng.integers(0, 256, (n, blocks, BLOCK * bits // 8), dtype=np.uint8)
    scales = rng.random(n * blocks).astype(np.float32) * 0.02
    zero_points = (
        np.zeros((n, (blocks + 1) // 2), np.uint8) if bits == 4 else np.full((n, blocks), 128, np.uint8)
    )
    inits = [
        numpy_helper.from_array(a, name) for a, name in ((packed, "q"), (scales, "s"), (zero_points, "z"))
    ]
    node = helper.make_node(
        "MatMulNBits", ["x", "q", "s", "z"], ["y"], domain="com.microsoft",
        K=K, N=n, bits=bits, block_size=BLOCK, accuracy_level=level,
    )  # fmt: skip
    graph = helper.make_graph(
        [node],
        "nbits",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 9
    return model.SerializeToString()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((9, K)).astype(np.float32)
    found = []
    for n, bits in ((1536, 4), (49152, 8)):
        for level in (0, 4):
            for threads in (1, 2):
                options = ort.SessionOptions()
                options.intra_op_num_threads = threads
                session = ort.InferenceSession(
                    node_model(n, bits, level, rng), options, providers=["CPUExecutionProvider"]
                )
                alone = session.run(None, {"x": x[:1]})[0][0]
                gaps = {
                    m: float(np.max(np.abs(session.run(None, {"x": x[:m]})[0][0] - alone)))
                    for m in (2, 3, 5, 9)
                }
                found.append(
                    {"n": n, "bits": bits, "accuracy_level": level, "threads": threads, "gap_by_rows": gaps}
                )
                print(json.dumps(found[-1]))
    if args.out is not None:
        args.out.write_text(json.dumps({"onnxruntime": ort.__version__, "runs": found}, indent=1) + "\n")


if __name__ == "__main__":
    main()
