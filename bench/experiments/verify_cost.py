"""What a verification forward costs (issue #44): one forward of w rows with every row's logits
read (a speculating step checks k = w - 1 drafted tokens) against a one-row decode step, through
the engine on any provider, over a session holding `past` tokens, median of 30 after 3 warm-up
runs; and the load-time probe's gaps on this machine (kernels.measure: how far a verification row
lies from a decode row, `verify_gap`, which decides `--speculate auto`); and a greedy A/B on a
prompt that repeats a passage, with and without prompt-lookup drafts (the verification path on
that provider, end to end).

    python -m bench.experiments.verify_cost --cache-root .pytest_cache/d/ladder-default-model
    python -m bench.experiments.verify_cost --provider cuda --model gpu:16x2048 --out DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from engine.executor import DecodeRow, EngineOptions
from engine.executor.engine import Engine
from engine.executor.kernels import measure
from engine.executor.session import Session
from engine.executor.step import Verified
from engine.planner.drafts import Lookup
from engine.sampling import Sampler, SamplingParams


def _timed(engine: Engine, session: Session, run: Callable[[], None]) -> float:
    """Median seconds of `run`, the session put back to its length after each (the logits read
    back to the host, so a device's work is done when the clock stops)."""
    past, held = session.length, list(session.tokens)
    times = []
    for i in range(33):
        started = time.perf_counter()
        run()
        engine.backend.row_logits(session.row)
        if i >= 3:
            times.append(time.perf_counter() - started)
        engine.pool.commit(session, past)
        session.tokens[:] = held
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache-root", type=Path, default=Path(".pytest_cache/d/ladder-default-model"))
    parser.add_argument("--model", default="default", help='"default", "gpu:<spec>" or a model directory')
    parser.add_argument("--precision", default="int4")
    parser.add_argument("--provider", default="cpu")
    parser.add_argument("--widths", default="2,3,5,9")
    parser.add_argument("--pasts", default="256,1024")
    parser.add_argument("--greedy", type=int, default=128, help="tokens of the greedy A/B (0: none)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.model == "default":
        from engine.default_model import prepare

        model = prepare(args.cache_root, precision=args.precision).model_dir
    elif args.model.startswith("gpu:"):
        from bench.gpu.run import build

        model = build(args.model[4:], Path("/tmp/ladder-gpu-models"))
    else:
        model = Path(args.model)
    engine = Engine.load(model, EngineOptions(provider=args.provider, speculate=True, max_sessions=2))
    rules = measure(engine)  # on CUDA too, where the engine assumes its rules without measuring
    vocab = engine.info.vocab_size
    out: dict[str, object] = {"model": str(model), "provider": args.provider, "kernels": asdict(rules)}
    print(json.dumps(out["kernels"]), flush=True)
    for past in (int(p) for p in args.pasts.split(",")):
        session = engine.open_session()
        engine.append(session, [(7919 * i + 13) % vocab for i in range(past)])
        step = _timed(engine, session, lambda s=session: engine.decoder.forward({s.row: 17}))
        row: dict[str, float] = {"step_ms": round(step * 1e3, 3)}
        for width in (int(w) for w in args.widths.split(",")):
            ids = [(31 * i + 5) % vocab for i in range(width)]
            verify = _timed(engine, session, lambda s=session, ids=ids: _verify(engine, s, ids))
            row[f"w{width}_ms"] = round(verify * 1e3, 3)
            row[f"w{width}_ratio"] = round(verify / step, 3)
        engine.close_session(session, keep=False)
        out[f"past{past}"] = row
        print(json.dumps({"past": past, **row}), flush=True)
    if args.greedy:
        out["greedy"] = greedy_ab(engine, args.greedy)
        print(json.dumps(out["greedy"]), flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"verify_cost-{args.provider}.json").write_text(json.dumps(out, indent=1))


def greedy_ab(engine: Engine, new: int) -> dict[str, object]:
    """A prompt that repeats a passage, continued greedily `new` tokens with and without
    prompt-lookup drafts of 4 (every draft verified whole), and with "oracle" drafts (the plain
    run's own next 4 tokens while the output still follows it: what verification gains where
    drafts are right, whatever the model): whether the tokens agree, forwards, seconds (the last
    run of each, warm)."""
    vocab = engine.info.vocab_size
    passage = [(7919 * i + 13) % vocab for i in range(60)]
    prompt = passage * 3 + passage[:10]
    tokens: dict[str, list[int]] = {}
    forwards: dict[str, int] = {}
    seconds: dict[str, float] = {}
    for mode in ("plain", "drafts", "plain", "drafts", "oracle", "oracle"):
        session = engine.open_session()
        engine.append(session, prompt)
        sampler = Sampler(SamplingParams())
        out = [engine.choose(session, sampler)]
        lookup, ran = Lookup(k=4, tokens=[*prompt, out[0]]), 0
        started = time.perf_counter()
        while len(out) < new:
            drafts: tuple[int, ...] = ()
            if mode == "drafts":
                drafts = lookup.propose()[: new - len(out) - 1]
            elif mode == "oracle" and out == tokens["plain"][: len(out)]:  # the plain run's next 4
                drafts = tuple(tokens["plain"][len(out) : min(len(out) + 4, new - 1)])
            got = engine.decode([DecodeRow(session, out[-1], sampler, drafts=drafts)])[0]
            chosen = [int(t) for t in got.tokens] if isinstance(got, Verified) else [int(got or 0)]
            out += chosen
            lookup.extend(chosen)
            ran += 1
        seconds[mode] = round(time.perf_counter() - started, 4)
        engine.close_session(session, keep=False)
        tokens[mode], forwards[mode] = out[:new], ran
    pairs = zip(tokens["plain"], tokens["drafts"], strict=True)
    return {
        "same_tokens": tokens["plain"] == tokens["drafts"],
        "first_difference": next((i for i, (a, b) in enumerate(pairs) if a != b), None),
        "oracle_same_tokens": tokens["plain"] == tokens["oracle"],
        "forwards": forwards,
        "seconds": seconds,
        "speedup": round(seconds["plain"] / seconds["drafts"], 3),
        "oracle_speedup": round(seconds["plain"] / seconds["oracle"], 3),
    }


def _verify(engine: Engine, session: Session, ids: list[int]) -> None:
    heads = engine.verify_forward(session, ids)
    assert heads is not None
    engine.backend.keep_row(session.row, heads.logits, len(ids) - 1)


if __name__ == "__main__":
    main()
