"""Does a request's greedy output depend on the load? `python -m service` with `--deterministic false`
and `--deterministic true` side by side, driven over gRPC (each server with prefix sharing on, and one of
each mode with it off as the fresh-run reference):

(a) `--streams` distinct greedy prompts (`--prompt` tokens, `--new` new tokens, ignore_eos), each sent
    alone, one after another;
(b) the same prompts all at once (threads), and the first `--fewer` of them at once: how many equal
    their run alone (and how many leading tokens agree where not);
(c) prompts over a held prefix: a prompt A (`--shared-lengths`) sent, then A again (it starts from
    the prefix A left held), then A's first two thirds + another tail (a partial share); each against
    A's first run and against the same prompt on the server with sharing off;
(d) aggregate output tok/s at 1 stream and `--streams` concurrent ones (fresh prompts, the two modes
    measured in turn, twice, the order swapped);
then, unless `--int4 none`, (a), (b) and (c) at `--int4-streams` on an int4 copy of the decoder (every layer
MatMul as MatMulNBits, 4 bits, block 32, symmetric, fp16 scales: what onnxruntime-genai's builder
writes for CUDA; the head stays fp16), served with `--max-sessions --int4-streams`.

    python -m bench.gpu.exactness --out $OUT        (on the GPU host: bench/gpu/exactness.sh)

Writes summary.json (counts, tok/s, ratios, decode batch widths used) and raw.json (every stream's
tokens) under --out.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.batching import agreement, concurrent, throughput
from bench.prefix import start_server, stream
from bench.served import (
    engine_stats,
    free_port,
    machine,
    prompt,
    resolve_model,
    server_arguments,
    stub,
    vocab_of,
    wait_serving,
)

MODES = ("default", "deterministic")
BLOCK = 32


# -- an int4 copy of the decoder ------------------------------------------------------------
def quantize_int4(source: Path, target: Path) -> Path:
    """`target`: `source`'s directory with every `model.layers.*` MatMul weight as MatMulNBits."""
    import onnx
    from onnx import helper, numpy_helper

    from engine.model import GRAPH_FILE
    from engine.modelgen.builder import int4_blocks, write_model_dir

    if (target / "genai_config.json").exists():
        return target
    model = onnx.load(str(source / GRAPH_FILE))
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    replaced: set[str] = set()
    nodes = []
    for node in graph.node:
        name = node.input[1] if node.op_type == "MatMul" and len(node.input) > 1 else ""
        if not (name.startswith("model.layers.") and name in inits):
            nodes.append(node)
            continue
        w = numpy_helper.to_array(inits[name])
        packed, scales = int4_blocks(w, BLOCK)
        graph.initializer.extend(
            [numpy_helper.from_array(packed, f"{name}.q4"), numpy_helper.from_array(scales, f"{name}.scales")]
        )
        nodes.append(
            helper.make_node(
                "MatMulNBits",
                [node.input[0], f"{name}.q4", f"{name}.scales"],
                list(node.output),
                name=f"{node.name}_nbits",
                domain="com.microsoft",
                K=w.shape[0],
                N=w.shape[1],
                bits=4,
                block_size=BLOCK,
                accuracy_level=4,
            )
        )
        replaced.add(name)
    del graph.node[:]
    graph.node.extend(nodes)
    kept = [t for t in graph.initializer if t.name not in replaced]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    if not any(d.domain == "com.microsoft" for d in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    config = json.loads((source / "genai_config.json").read_text())
    write_model_dir(tmp, model, config)
    for extra in source.iterdir():
        if not (tmp / extra.name).exists() and extra.is_file() and not extra.name.startswith(GRAPH_FILE):
            shutil.copy(extra, tmp / extra.name)
    tmp.replace(target)
    return target


# -- servers ------------------------------------------------------------------------------------
class Server:
    """`python -m service` (bench.prefix.start_server) in one mode, sharing on or off."""

    ports: set[int] = set()

    def __init__(self, args: argparse.Namespace, model: str, mode: str, sharing: bool, slots: int) -> None:
        flags = f"--deterministic {'true' if mode == 'deterministic' else 'false'} --max-queue 1024"
        options = argparse.Namespace(
            **{**vars(args), "slots": slots, "server_args": f"{flags} {args.server_args}"}
        )
        port = free_port()
        while port in Server.ports:  # servers started together: never the same port twice
            port = free_port()
        Server.ports.add(port)
        self.address = f"127.0.0.1:{port}"
        self.process = start_server(options, model, port, args.chunk, sharing)

    def client(self) -> Any:
        return stub(self.address)

    def stop(self) -> int:
        self.process.terminate()
        return self.process.wait(120)


def start_all(args: argparse.Namespace, model: str, slots: int) -> dict[str, Server]:
    servers = {mode: Server(args, model, mode, True, slots) for mode in MODES}
    servers.update({f"{mode}_sharing_off": Server(args, model, mode, False, slots) for mode in MODES})
    t0 = time.perf_counter()
    for server in servers.values():
        wait_serving(server.address, 300)
    print(f"{len(servers)} servers SERVING after {time.perf_counter() - t0:.0f} s", flush=True)
    return servers


# -- the checks ---------------------------------------------------------------------------------
def at_once(address: str, prompts: list[list[int]], new: int) -> list[dict[str, Any]]:
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda p: stream(stub(address), p, new), prompts))


def load_checks(server: Server, prompts: list[list[int]], new: int, fewer: int) -> dict[str, Any]:
    """(a) each prompt alone, one after another; (b) all at once, and the first `fewer` at once."""
    client = server.client()
    alone = [stream(client, p, new) for p in prompts]
    ids = [r["ids"] for r in alone]
    out: dict[str, Any] = {"alone_shared_rows": sum(r["shared_rows"] for r in alone)}
    for n in sorted({len(prompts), fewer}, reverse=True):
        together = at_once(server.address, prompts[:n], new)
        out[f"at_once_{n}"] = {
            **agreement(ids[:n], [r["ids"] for r in together]),
            "shared_rows": sum(r["shared_rows"] for r in together),
        }
    out["tokens_alone"] = ids
    return out


def shared_prefix(
    server: Server, reference: Server | None, lengths: list[int], new: int, vocab: int
) -> list[dict[str, Any]]:
    """(c) A, A again, A's first two thirds + another tail; against A's first run and a sharing-off server."""
    client, ref = server.client(), reference.client() if reference else None
    rows = []
    for i, n in enumerate(lengths):
        a = prompt(n, 7000 + i, vocab)
        part = a[: 2 * n // 3] + prompt(n - 2 * n // 3, 8000 + i, vocab)
        first, again, partial = stream(client, a, new), stream(client, a, new), stream(client, part, new)
        row = {
            "length": n,
            "first_shared_rows": first["shared_rows"],
            "again_shared_rows": again["shared_rows"],
            "again_equals_first": again["ids"] == first["ids"],
            "partial_shared_rows": partial["shared_rows"],
        }
        if ref is not None:
            fresh_a, fresh_part = stream(ref, a, new), stream(ref, part, new)
            row.update(
                first_equals_sharing_off=first["ids"] == fresh_a["ids"],
                again_equals_sharing_off=again["ids"] == fresh_a["ids"],
                partial_equals_sharing_off=partial["ids"] == fresh_part["ids"],
                partial_common_prefix=agreement([fresh_part["ids"]], [partial["ids"]])["common_prefix"][0],
            )
        rows.append(row)
    return rows


def speed(servers: dict[str, Server], args: argparse.Namespace, vocab: int) -> dict[str, Any]:
    """(d) 1 stream (three runs, median) and all streams at once, fresh prompts (nothing to share),
    the same prompts to both modes; two rounds, the modes' order swapped."""
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {m: {"1": [], "many": []} for m in MODES}
    for rnd in range(2):
        base = 20_000 + 1000 * rnd
        for mode in MODES[:: 1 if rnd == 0 else -1]:
            address = servers[mode].address
            for r in range(3):
                runs[mode]["1"].append(
                    throughput(concurrent(address, [prompt(args.prompt, base + r, vocab)], args.speed_new, 1))
                )
            many = [prompt(args.prompt, base + 100 + i, vocab) for i in range(args.streams)]
            runs[mode]["many"].append(
                throughput(concurrent(address, many, args.speed_new, args.client_processes))
            )
    out: dict[str, Any] = {}
    for mode, rows in runs.items():
        out[mode] = {}
        for key, label in (("1", "1"), ("many", str(args.streams))):
            out[mode][label] = {
                "end_to_end_tok_s": statistics.median(r["end_to_end_tok_s"] for r in rows[key]),
                "steady_tok_s": statistics.median(r["steady_tok_s"] or 0.0 for r in rows[key]),
                "inter_token_ms_p50": statistics.median(r["inter_token_ms_p50"] for r in rows[key]),
                "runs_end_to_end_tok_s": [round(r["end_to_end_tok_s"], 1) for r in rows[key]],
            }
    out["deterministic_over_default"] = {
        n: {
            k: out["deterministic"][n][k] / out["default"][n][k]
            for k in ("end_to_end_tok_s", "steady_tok_s")
            if out["default"][n][k]
        }
        for n in ("1", str(args.streams))
    }
    return out


def widths(address: str, before: dict[str, int] | None = None) -> dict[str, int]:
    """Decode forwards per batch width (since `before`: warm-up's own forwards left out)."""
    now = engine_stats(address)["batch_use"]
    return {w: n - (before or {}).get(w, 0) for w, n in now.items() if n - (before or {}).get(w, 0)}


def run_model(
    args: argparse.Namespace, model: str, vocab: int, streams: int, timed: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Every check on one model: (a), (b), (c); with `timed` (d) too. Returns (summary, raw tokens)."""
    prompts = [prompt(args.prompt, seed, vocab) for seed in range(streams)]
    fewer = min(args.fewer, streams)
    servers = start_all(args, model, streams)
    warm = {mode: widths(servers[mode].address) for mode in MODES}
    summary: dict[str, Any] = {"streams": streams, "prompt": args.prompt, "new": args.new}
    raw: dict[str, Any] = {}
    try:
        for mode in MODES:
            t0 = time.perf_counter()
            checks = load_checks(servers[mode], prompts, args.new, fewer)
            raw[mode] = {"alone": checks.pop("tokens_alone")}
            summary[mode] = checks
            summary[mode]["shared_prefix"] = shared_prefix(
                servers[mode], servers[f"{mode}_sharing_off"], args.shared_lengths, args.new, vocab
            )
            summary[mode]["checks_s"] = round(time.perf_counter() - t0, 1)
            print(mode, json.dumps(summary[mode]), flush=True)
        summary["alone_tokens_equal_between_modes"] = sum(
            a == b for a, b in zip(raw["default"]["alone"], raw["deterministic"]["alone"], strict=True)
        )
        for mode in MODES:
            servers.pop(f"{mode}_sharing_off").stop()
        if timed:
            summary["speed"] = speed(servers, args, vocab)
            print("speed", json.dumps(summary["speed"]), flush=True)
        for mode in MODES:
            summary[mode]["decode_batch_widths"] = widths(servers[mode].address, warm[mode])
    finally:
        for server in servers.values():
            server.stop()
    return summary, raw


def main() -> None:
    parser = argparse.ArgumentParser()
    server_arguments(parser, provider="cuda", model="gpu:16x2048", precision="fp16")
    parser.add_argument("--streams", type=int, default=64, help="prompts, concurrent streams, --max-sessions")
    parser.add_argument("--fewer", type=int, default=24, help="(b) again with this many at once")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--speed-new", type=int, default=128, help="new tokens per stream in (d)")
    parser.add_argument("--shared-lengths", default="700,1100,1600,2000")
    parser.add_argument("--capacity", type=int, default=4096)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--client-processes", type=int, default=8)
    parser.add_argument(
        "--int4", default="same", help='"same" (an int4 copy of --model), "none", or a directory'
    )
    parser.add_argument("--int4-streams", type=int, default=64)
    parser.add_argument("--server-args", default="--log-level warning")
    args = parser.parse_args()
    args.shared_lengths = [int(n) for n in args.shared_lengths.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    import onnxruntime

    t0 = time.perf_counter()
    model = resolve_model(args)
    result: dict[str, Any] = {
        "machine": machine(),
        "onnxruntime": onnxruntime.__version__,
        "command": " ".join(sys.argv),
        "model": args.model,
        "build_s": round(time.perf_counter() - t0, 1),
        "models": {},
    }
    vocab = vocab_of(model)
    raw: dict[str, Any] = {}
    result["models"]["fp16"], raw["fp16"] = run_model(args, model, vocab, args.streams, True)
    (args.out / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    if args.int4 != "none":
        t0 = time.perf_counter()
        int4 = (
            Path(args.int4)
            if args.int4 != "same"
            else quantize_int4(Path(model), Path(model).with_name(Path(model).name + "-int4"))
        )
        result["int4_build_s"] = round(time.perf_counter() - t0, 1)
        result["models"]["int4"], raw["int4"] = run_model(args, str(int4), vocab, args.int4_streams, False)
    (args.out / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "raw.json").write_text(json.dumps(raw) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
