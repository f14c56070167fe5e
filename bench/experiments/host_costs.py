"""Issue #42: what the worker's per-token Python costs, piece by piece, on this machine's CPU.

Made to see which host costs of a decode step are worth removing once onnxruntime's graph replay
is known to wait for its forward (the step's host work is added to every step, not overlapped):
making a frozen dataclass (three per token: TokenOut, DecodeRow, Token) against a plain one, the
`counted` wrapper's generator layer per token, and pickling one step's 70 TokenOuts onto the
core's link as dataclasses or with a `__reduce__`.

    python -m bench.experiments.host_costs > bench/results/host-costs-YYYY-MM-DD/host-costs.json
"""

from __future__ import annotations

import json
import pickle
import time
import timeit
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from service.core.counting import Totals, counted
from service.events import TokenOut
from service.metrics import Metrics


@dataclass(frozen=True)
class Frozen:
    id: int
    text: str
    index: int
    at: float
    logprobs: object = None
    sample: int = 0


@dataclass
class Plain:
    id: int
    text: str
    index: int
    at: float
    logprobs: object = None
    sample: int = 0


@dataclass(frozen=True)
class Reduced(Frozen):
    def __reduce__(self) -> tuple[Any, ...]:
        return (Reduced, (self.id, self.text, self.index, self.at, self.logprobs, self.sample))


def per_call_us(fn: Any, number: int) -> float:
    return timeit.timeit(fn, number=number) / number * 1e6


def tokens(n: int) -> Generator[Any, Any, None]:
    request = object()
    for i in range(n):
        yield TokenOut(1, "", i, 0.0, None, 0)
        yield request


def drive(body: Generator[Any, Any, None]) -> None:
    next(body)
    try:
        while True:
            body.send(None)
    except StopIteration:
        pass


def main() -> None:
    out: dict[str, float] = {
        "frozen_dataclass_init_us": per_call_us(lambda: Frozen(1, "", 2, 3.0, None, 0), 200_000),
        "plain_dataclass_init_us": per_call_us(lambda: Plain(1, "", 2, 3.0, None, 0), 200_000),
    }
    n = 100_000
    start = time.perf_counter()
    drive(tokens(n))
    direct = time.perf_counter() - start
    start = time.perf_counter()
    drive(counted(tokens(n), Metrics(), Totals()))
    out["counted_extra_us_per_token"] = (time.perf_counter() - start - direct) / n * 1e6
    for name, kind in (("dataclass", Frozen), ("reduce", Reduced)):
        step = [(10, 7, [kind(123, "", i, time.perf_counter(), None, 0)]) for i in range(70)]
        data = pickle.dumps(step, protocol=pickle.HIGHEST_PROTOCOL)
        out[f"pickle_dumps_70_{name}_us"] = per_call_us(lambda s=step: pickle.dumps(s, protocol=5), 2_000)
        out[f"pickle_loads_70_{name}_us"] = per_call_us(lambda d=data: pickle.loads(d), 2_000)
    print(json.dumps({k: round(v, 2) for k, v in out.items()}, indent=1))


if __name__ == "__main__":
    main()
