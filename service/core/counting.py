"""The core's own count of the work done: every prefill forward (ForwardDone) and every token of
every sample (TokenOut) is added to the counters and the engine totals as the worker yields it
(`counted` wraps the job), however the call ends and wherever it is answered."""

from __future__ import annotations

from dataclasses import dataclass

from service.events import ForwardDone, TokenOut
from service.metrics import Metrics
from service.worker.jobs import Body


@dataclass
class Totals:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    padded_rows: int = 0


def counted(body: Body, metrics: Metrics, totals: Totals) -> Body:
    """`body` as a job whose work is counted as the worker yields it (the core's counters): prefill
    forwards and rows, and the tokens of every sample, whether or not the call is still there."""
    try:
        item = next(body)
        while True:
            _count(item, metrics, totals)
            try:
                reply = yield item
            except GeneratorExit:
                body.close()
                raise
            except BaseException as exc:  # noqa: BLE001 — handed to the body, as `yield from` does
                item = body.throw(exc)
            else:
                item = body.send(reply)
    except StopIteration:
        return


def _count(item: object, metrics: Metrics, totals: Totals) -> None:
    """One event of the job, on the worker thread."""
    if isinstance(item, TokenOut):
        metrics.generated_tokens.inc()
        totals.generated_tokens += 1
    elif isinstance(item, ForwardDone):
        padded = item.width - item.real_rows
        metrics.prefill(1, item.real_rows, padded)
        totals.prompt_tokens += item.real_rows
        totals.padded_rows += padded
