"""One benchmark worker per runtime, run in its own process so its peak RSS is its own.

Each runtime adapter offers `prefill(ids) -> first token` (a fresh sequence)
and `decode(token) -> next token` (greedy, on that sequence). The worker
prints one JSON line: TTFT per prompt length, decode tokens/s, peak RSS.
Run as `python -m bench.cpu.runtimes RUNTIME MODEL_DIR GGUF PROMPT_IDS_JSON [options]`;
the llama.cpp worker runs under the separate venv that has llama-cpp-python.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np


class Runtime(Protocol):
    def prefill(self, ids: list[int]) -> int: ...
    def decode(self, token: int) -> int: ...


class LadderRuntime:
    def __init__(self, model_dir: Path, chunk_size: int | None, padding: bool) -> None:
        from engine.executor import DecodeRow, EngineOptions
        from engine.executor.engine import Engine
        from engine.sampling import Sampler, SamplingParams

        self.engine = Engine.load(
            model_dir, EngineOptions(chunk_size=chunk_size, padding=padding, max_sessions=1)
        )
        self.decode_row = DecodeRow
        self.sampler = Sampler(SamplingParams())  # greedy
        self.session: Any = None

    def prefill(self, ids: list[int]) -> int:
        if self.session is not None:
            self.engine.close_session(self.session)
        self.session = self.engine.open_session()
        return int(np.argmax(self.engine.append(self.session, ids)))

    def decode(self, token: int) -> int:
        # One decode step, the token chosen where the logits are (as the service decodes).
        chosen = self.engine.decode([self.decode_row(self.session, token, self.sampler)])[0]
        assert chosen is not None
        return chosen


class GenaiRuntime:
    def __init__(self, model_dir: Path) -> None:
        import onnxruntime_genai as og

        self.og = og
        self.model = og.Model(str(model_dir))
        config = json.loads((model_dir / "genai_config.json").read_text())
        self.context_length = int(config["model"]["context_length"])
        self.generator: Any = None

    def prefill(self, ids: list[int]) -> int:
        self.generator = None  # release the previous KV before allocating the next
        params = self.og.GeneratorParams(self.model)
        room = min(len(ids) + 130, self.context_length)
        params.set_search_options(do_sample=False, max_length=room)
        self.generator = self.og.Generator(self.model, params)
        self.generator.append_tokens(ids)
        return self._next()

    def _next(self) -> int:
        self.generator.generate_next_token()
        return int(self.generator.get_next_tokens()[0])

    def decode(self, token: int) -> int:
        return self._next()  # genai appended `token` itself when it picked it


class LlamaCppRuntime:
    def __init__(self, gguf: Path, n_ctx: int) -> None:
        from llama_cpp import Llama

        self.llm = Llama(
            model_path=str(gguf), n_ctx=n_ctx, n_threads=2, n_threads_batch=2, n_batch=512, verbose=False
        )

    def _argmax(self) -> int:
        # Without logits_all, llama-cpp-python keeps no scores: read the last row from the context.
        logits = np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.llm.n_vocab(),))
        return int(np.argmax(logits))

    def prefill(self, ids: list[int]) -> int:
        self.llm.reset()
        self.llm.eval(ids)
        return self._argmax()

    def decode(self, token: int) -> int:
        self.llm.eval([token])
        return self._argmax()


def peak_rss_mb() -> float:
    """VmHWM: the resident high-water mark of this process."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def timed(fn: Callable[[], int]) -> tuple[int, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def best_ttft(rt: Runtime, ids: list[int], repeats: int) -> dict[str, float]:
    """Fastest and median of `repeats` prefills: the fastest is the least disturbed by others."""
    times = sorted(timed(lambda: rt.prefill(ids))[1] for _ in range(repeats))
    return {"best": times[0], "median": float(np.median(times))}


def decode_rate(rt: Runtime, prompt: list[int], new_tokens: int) -> dict[str, Any]:
    """Greedy decode after `prompt`: tokens/s from the median and from the total step time."""
    tokens = [rt.prefill(prompt)]
    steps = []
    for _ in range(new_tokens):
        token, seconds = timed(lambda: rt.decode(tokens[-1]))
        tokens.append(token)
        steps.append(seconds)
    return {
        "decode_tok_s": 1 / float(np.median(steps)),
        "decode_tok_s_mean": len(steps) / sum(steps),
        "greedy_after_prompt": tokens[:16],
    }


def run_workload(
    rt: Runtime, ids: list[int], lengths: list[int], decode_after: int, new_tokens: int, repeats: int
) -> dict[str, Any]:
    rt.prefill(ids[:16])  # warm-up: first-run allocations are not TTFT
    # Long prompts run fewer times: each already lasts seconds, so noise matters less.
    ttft = {str(n): best_ttft(rt, ids[:n], repeats if n <= 1000 else max(1, repeats - 1)) for n in lengths}
    result: dict[str, Any] = {
        "ttft_s": {n: t["best"] for n, t in ttft.items()},
        "ttft_median_s": {n: t["median"] for n, t in ttft.items()},
    }
    if new_tokens:
        result.update(decode_rate(rt, ids[:decode_after], new_tokens))
    return result


def make_runtime(args: argparse.Namespace) -> Runtime:
    if args.runtime == "ladder":
        chunk = None if args.chunk_size < 0 else args.chunk_size
        return LadderRuntime(args.model_dir, chunk, not args.no_padding)
    if args.runtime == "genai":
        return GenaiRuntime(args.model_dir)
    return LlamaCppRuntime(args.gguf, n_ctx=max(args.lengths) + args.new_tokens + 64)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("runtime", choices=["ladder", "genai", "llamacpp"])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("gguf", type=Path)
    parser.add_argument("prompt_ids", type=Path)
    parser.add_argument("--lengths", type=int, nargs="+", default=[100, 1000, 4000])
    parser.add_argument("--decode-after", type=int, default=1000)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--chunk-size", type=int, default=-1, help="-1: the model's own")
    parser.add_argument("--no-padding", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    ids = json.loads(args.prompt_ids.read_text())
    rss_start = peak_rss_mb()
    rt, load_s = timed(lambda: make_runtime(args))  # type: ignore[arg-type,return-value]
    result = run_workload(rt, ids, args.lengths, args.decode_after, args.new_tokens, args.repeats)
    result.update(
        runtime=args.runtime,
        load_s=load_s,
        peak_rss_mb=peak_rss_mb(),
        interpreter_rss_mb=rss_start,
        loadavg_1m_after=os.getloadavg()[0],
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
