"""SmolLM2-135M-Instruct, converted from its GGUF, on Ladder and onnxruntime-genai side by side.

Usage (on the GPU host, from the repo root, once the GGUF is in CACHE/downloads):
    python3 -m bench.gpu.smollm2 --cache-root CACHE --out $OUT            (CUDA, fp16)
    python -m bench.gpu.smollm2 --provider cpu --precision int4 --lengths 100,300 --new 16 \
        --cache-root CACHE --out DIR                                      (a dry run on CPU)
    python3 -m bench.gpu.smollm2 serve-check CACHE OUT cuda|cpu          (the served answers)

Converts the GGUF into the default model's directory (`engine.default_model.prepare`,
the precision the server picks for the provider: fp16 on CUDA), then runs each
runtime in its own process on that same directory (onnxruntime-genai through a
view of it whose genai_config.json asks for its CUDA provider with CUDA graphs):
TTFT at each prompt length (first sight and steady, random ids), decode tok/s for
`--new` tokens after the 1000-token prompt, and the greedy tokens of the README
prompt, the chat question and that 1000-token prompt. Writes smollm2-results.json
and smollm2-results.md under --out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.gpu.run import agreement

REPO = Path(__file__).resolve().parents[2]
README_PROMPT = "The capital of France is"
CHAT_PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
DECODE_AFTER = 1000
REPEATS = 3


# -- the parent: prepare, run the workers, summarize ------------------------------------------
def prepare_model(cache_root: Path, precision: str) -> tuple[Path, float]:
    from engine.default_model import prepare

    t0 = time.perf_counter()
    model_dir = prepare(cache_root, precision=precision).model_dir
    return model_dir, time.perf_counter() - t0


def genai_view(model_dir: Path, provider: str) -> Path:
    """The same files, with a genai_config.json that puts onnxruntime-genai on `provider`."""
    view = model_dir.with_name(model_dir.name + f"-genai-{provider}")
    view.mkdir(exist_ok=True)
    for entry in model_dir.iterdir():
        link = view / entry.name
        if entry.name != "genai_config.json" and not link.exists():
            link.symlink_to(entry.resolve())
    config = json.loads((model_dir / "genai_config.json").read_text())
    options = [{"cuda": {"enable_cuda_graph": "1"}}] if provider == "cuda" else []
    config["model"]["decoder"]["session_options"]["provider_options"] = options
    (view / "genai_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return view


def prompts(model_dir: Path, lengths: list[int]) -> dict[str, list[int]]:
    from bench.gpu.workers import prompt
    from engine.tokenizer import Tokenizer

    tokenizer = Tokenizer(model_dir)
    out = {f"random_{n}": prompt(n, tokenizer.vocab_size) for n in sorted({*lengths, DECODE_AFTER})}
    out["readme"] = tokenizer.encode(README_PROMPT)
    out["chat"] = tokenizer.encode(CHAT_PROMPT)
    return out


def run_worker(runtime: str, path: Path, job: Path, log: Path, timeout: int) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "bench.gpu.smollm2", "worker", runtime, str(path), str(job)]
    with log.open("a") as err:
        err.write(f"\n== {' '.join(cmd)}\n")
        err.flush()
        try:
            done = subprocess.run(
                cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=err, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"error": f"exit {done.returncode}; see {log.name}"}
    return dict(json.loads(lines[-1]))


def summarize(ladder: dict[str, Any], genai: dict[str, Any], lengths: list[int]) -> dict[str, Any]:
    if "error" in ladder or "error" in genai:
        return {"error": "a worker failed; see the log"}
    out: dict[str, Any] = {"ttft_steady_ms": {}, "ttft_first_ms": {}, "ttft_ratio_genai_over_ladder": {}}
    for n in lengths:
        ours, theirs = ladder["ttft"][str(n)], genai["ttft"][str(n)]
        out["ttft_first_ms"][n] = {"ladder": ours["first_ms"], "genai": theirs["first_ms"]}
        out["ttft_steady_ms"][n] = {"ladder": ours["steady_ms"], "genai": theirs["steady_ms"]}
        out["ttft_ratio_genai_over_ladder"][n] = theirs["steady_ms"] / ours["steady_ms"]
    ours, theirs = ladder["decode"]["tok_s"], genai["decode"]["tok_s"]
    out["decode_tok_s"] = {"ladder": ours, "genai": theirs, "ratio_ladder_over_genai": ours / theirs}
    out["greedy_agreement"] = {
        name: agreement(ladder["greedy"][name], genai["greedy"][name]) for name in ladder["greedy"]
    }
    return out


def markdown(results: dict[str, Any]) -> str:
    s = results["summary"]
    lines = [
        f"# SmolLM2-135M-Instruct ({results['precision']}, {results['provider']}) — {results['date']}",
        "",
        f"Command: `{results['command']}`",
        "",
    ]
    if "error" in s:
        return "\n".join([*lines, s["error"], ""])
    lines += [
        "| prompt tokens | Ladder TTFT ms (first / steady) | onnxruntime-genai TTFT ms "
        "(first / steady) | genai / Ladder (steady) |",
        "| --- | --- | --- | --- |",
    ]
    for n, ratio in s["ttft_ratio_genai_over_ladder"].items():
        first, steady = s["ttft_first_ms"][n], s["ttft_steady_ms"][n]
        lines.append(
            f"| {n} | {first['ladder']:.1f} / {steady['ladder']:.1f} | "
            f"{first['genai']:.1f} / {steady['genai']:.1f} | {ratio:.2f}× |"
        )
    d = s["decode_tok_s"]
    lines += [
        "",
        f"Decode, {results['new']} tokens after {DECODE_AFTER}: Ladder {d['ladder']:.0f} tok/s, "
        f"onnxruntime-genai {d['genai']:.0f} tok/s ({d['ratio_ladder_over_genai']:.2f}×).",
        "",
        "Greedy agreement (common prefix / compared):",
    ]
    agreed = s["greedy_agreement"].items()
    lines += [f"- {name}: {a['common_prefix']} / {a['compared']}" for name, a in agreed]
    return "\n".join([*lines, ""])


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu.smollm2")
    parser.add_argument("--cache-root", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--provider", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--precision", default=None, help="default: fp16 on CUDA, int4 on CPU")
    parser.add_argument("--lengths", default="100,1000,4000")
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--timeout", type=int, default=200)
    args = parser.parse_args(argv)
    precision = args.precision or ("fp16" if args.provider == "cuda" else "int4")
    lengths = [int(n) for n in args.lengths.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir, convert_s = prepare_model(args.cache_root, precision)
    print(f"prepared {model_dir} in {convert_s:.1f} s", flush=True)
    job = args.out / "smollm2-job.json"
    job.write_text(
        json.dumps(
            {
                "provider": args.provider,
                "lengths": lengths,
                "new": args.new,
                "prompts": prompts(model_dir, lengths),
            }
        )
    )
    log = args.out / "smollm2-bench.log"
    runs = {
        "ladder": run_worker("ladder", model_dir, job, log, args.timeout),
        "genai": run_worker("genai", genai_view(model_dir, args.provider), job, log, args.timeout),
    }
    for name, result in runs.items():
        print(name, json.dumps(result)[:600], flush=True)
    command = " ".join(["python -m bench.gpu.smollm2", *argv])
    results = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": command,
        "provider": args.provider,
        "precision": precision,
        "model_dir": str(model_dir),
        "convert_s": convert_s,
        "new": args.new,
        "runs": runs,
        "summary": summarize(runs["ladder"], runs["genai"], lengths),
    }
    (args.out / "smollm2-results.json").write_text(json.dumps(results, indent=1))
    (args.out / "smollm2-results.md").write_text(markdown(results))
    print(markdown(results), flush=True)


# -- the served model: `ladder serve --model default` on the provider, asked through the client ----
def serve_check(cache_root: Path, out: Path, provider: str) -> dict[str, Any]:
    """Start the real server on the default model (it picks the provider's precision), ask the
    README prompt and the chat question through the Python client, stop it with SIGTERM."""
    import socket

    from clients.python import LadderClient, Stopping, Turn

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "service",
        "--model",
        "default",
        "--model-cache",
        str(cache_root),
        "--provider",
        provider,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--metrics-port",
        "0",
        "--max-sessions",
        "2",
    ]
    with (out / "serve-check.log").open("w") as log:
        server = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        try:
            with LadderClient(f"127.0.0.1:{port}") as client:
                status = client.wait_until_serving(300)
                info = client.model_info()
                readme = client.generate(README_PROMPT, stopping=Stopping(max_new_tokens=8))
                chat = client.generate(
                    [Turn("user", "What is the capital of France?")], stopping=Stopping(max_new_tokens=16)
                )
        finally:
            server.terminate()
            server.wait(60)
    return {
        "status": status,
        "model": info.model,
        "execution_provider": info.execution_provider,
        "chunk_size": info.chunk_size,
        "ladder": list(info.ladder),
        "readme": readme.text,
        "chat": chat.text,
        "server_exit": server.returncode,
    }


# -- the workers: one runtime each, in a process of its own --------------------------------------
def measure(generate: Any, job: dict[str, Any]) -> dict[str, Any]:
    """TTFT per length (the first request at that length, then the median of REPEATS), decode rate
    after DECODE_AFTER tokens, and greedy tokens; `generate(ids, new)` returns workers' dict."""
    p = job["prompts"]
    ttft = {}
    for n in job["lengths"]:
        first = generate(p[f"random_{n}"], 1)["ttft_ms"]
        steady = statistics.median(generate(p[f"random_{n}"], 1)["ttft_ms"] for _ in range(REPEATS))
        ttft[str(n)] = {"first_ms": first, "steady_ms": steady}
    generate(p[f"random_{DECODE_AFTER}"], job["new"])  # the decode shapes seen once
    decoded = generate(p[f"random_{DECODE_AFTER}"], job["new"])
    greedy = {
        "readme": generate(p["readme"], 16)["tokens"],
        "chat": generate(p["chat"], 16)["tokens"],
        f"random_{DECODE_AFTER}": decoded["tokens"],
    }
    return {
        "ttft": ttft,
        "decode": {"tok_s": decoded["decode_tok_s"], "tokens": len(decoded["tokens"])},
        "greedy": greedy,
    }


def ladder_worker(path: str, job: dict[str, Any]) -> dict[str, Any]:
    from bench.gpu.workers import ladder_generate
    from engine.executor import EngineOptions
    from engine.executor.engine import Engine

    t0 = time.perf_counter()
    engine = Engine.load(path, EngineOptions(provider=job["provider"], max_sessions=1))
    load_s = time.perf_counter() - t0
    prepared = engine.warm_up()  # as the server does before it reports SERVING
    result = measure(lambda ids, new: ladder_generate(engine, ids, new), job)
    return {
        "load_s": load_s,
        "warm_up_s": time.perf_counter() - t0 - load_s,
        "variants": prepared,
        "backend": engine.backend.name,
        "eager_forwards": engine.eager_forwards,
        **result,
    }


def genai_worker(path: str, job: dict[str, Any]) -> dict[str, Any]:
    import onnxruntime_genai as og

    from bench.gpu.workers import genai_generate

    t0 = time.perf_counter()
    model = og.Model(path)
    load_s = time.perf_counter() - t0
    capacity = json.loads((Path(path) / "genai_config.json").read_text())["search"]["max_length"]
    result = measure(lambda ids, new: genai_generate(model, ids, new, max_length=capacity), job)
    return {"load_s": load_s, "version": og.__version__, **result}


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve-check"]:
        cache, out_dir, chosen = Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
        checked = serve_check(cache, out_dir, chosen)
        (out_dir / "serve-check.json").write_text(json.dumps(checked, indent=1))
        print(json.dumps(checked), flush=True)
    elif sys.argv[1:2] == ["worker"]:
        runtime, model_path, job_path = sys.argv[2:5]
        work = ladder_worker if runtime == "ladder" else genai_worker
        print(json.dumps(work(model_path, json.loads(Path(job_path).read_text()))), flush=True)
    else:
        main(sys.argv[1:])
