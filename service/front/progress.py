"""One generation's running record: tokens, text, finish, timing; it feeds the metrics as it goes.

The servicer folds every worker event into a Progress and builds its protobuf
Completion from it at the end; nothing here knows about protobuf. The access
log line of the call reads it too (service/door/call_log.py).

Time to first token is the time to the first token *of a prompt*: Generate and
GenerateStream observe it at their first token, Prefill when PrefillDone (which
carries the prompt's next token) is ready. Decode continues a session whose
prompt was prefilled already; its first token is no first token of a prompt,
so Decode observes no TTFT, only inter-token latency between its tokens.

Work itself is counted where it is done, on the core's side (service/core/counting.py).
`end(code)` closes a call that ended before all its samples finished: each
unfinished sample counts with the reason `cancelled`, `deadline_exceeded` or
`error`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import grpc

from engine.sampling import TokenLogprobs
from service.events import (
    Finish,
    Finished,
    ForwardDone,
    PrefillTally,
    PromptLogprobs,
    Shared,
    Started,
    TokenOut,
)
from service.metrics import TTFT_METHODS, Metrics


@dataclass
class SampleRecord:
    """What one sample of a request produced (sample 0's lives in Progress itself)."""

    token_ids: list[int] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    finished: Finished | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces) + (self.finished.tail if self.finished else "")


@dataclass
class Progress:
    arrived: float
    prompt_tokens: int
    tally: PrefillTally
    metrics: Metrics
    started: float | None = None
    token_ids: list[int] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    finished: Finished | None = None
    ended: float | None = None
    method: str = ""  # the RPC, the metrics' label
    samples: int = 1  # the request's n: the call is over when each has finished
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # sample 0's, when asked
    prompt_logprobs: list[TokenLogprobs] = field(default_factory=list)
    others: dict[int, SampleRecord] = field(default_factory=dict)  # samples 1..n-1
    _finished_samples: int = 0
    _series: Any = None  # service.metrics.MethodMetrics of `method`
    ending: str = ""  # how the call cut its unfinished samples short: cancelled, deadline_exceeded, error
    _closed: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)  # close() against a late end()

    @property
    def series(self) -> Any:
        if self._series is None:
            self._series = self.metrics.for_method(self.method)
        return self._series

    def see(self, event: Any) -> None:
        if isinstance(event, Started):
            self.started = event.at
        elif isinstance(event, ForwardDone):
            self.tally.forward(event)
        elif isinstance(event, Shared):
            self.tally.shared_rows += event.rows
        elif isinstance(event, TokenOut) and event.sample:
            self._other_token(event)
        elif isinstance(event, TokenOut):
            self._token(event)
        elif isinstance(event, PromptLogprobs):
            self.prompt_logprobs = list(event.logprobs)
        elif isinstance(event, Finished):
            self._finished(event)

    def _finished(self, event: Finished) -> None:
        if event.sample:
            self.others.setdefault(event.sample, SampleRecord()).finished = event
        else:
            self.finished = event
        self._finished_samples += 1
        if self._finished_samples == self.samples:
            self.close()

    def _other_token(self, event: TokenOut) -> None:
        record = self.others.setdefault(event.sample, SampleRecord())
        record.token_ids.append(event.id)
        record.pieces.append(event.text)
        if event.logprobs is not None:
            record.logprobs.append(event.logprobs)

    @property
    def generated(self) -> int:
        """Tokens generated over every sample."""
        return len(self.token_ids) + sum(len(r.token_ids) for r in self.others.values())

    def sample_records(self) -> list[SampleRecord]:
        """Every sample's record, sample 0 first."""
        first = SampleRecord(self.token_ids, self.pieces, self.logprobs, self.finished)
        return [first, *(self.others.get(i, SampleRecord()) for i in range(1, self.samples))]

    def _token(self, event: TokenOut) -> None:
        if self.token_times:
            self.series.inter_token.observe(event.at - self.token_times[-1])
        elif self.method in TTFT_METHODS:
            self.series.ttft.observe(event.at - self.arrived)
        self.token_ids.append(event.id)
        self.pieces.append(event.text)
        self.token_times.append(event.at)
        if event.logprobs is not None:
            self.logprobs.append(event.logprobs)

    def end(self, code: grpc.StatusCode) -> None:
        """The call has ended with `code`: close it if some sample had not finished (each such
        sample counts as finished by the call's ending). Once per call; after close() a no-op."""
        if code == grpc.StatusCode.OK:
            return self.close()
        reason = {
            grpc.StatusCode.CANCELLED: "cancelled",
            grpc.StatusCode.DEADLINE_EXCEEDED: "deadline_exceeded",
        }.get(code, "error")
        return self.close(reason)

    def close(self, ending: str = "") -> None:
        """The call is over: stop the clock and observe its latencies and lengths, one length and
        one finish reason per sample (`ending` for samples that had not finished). Once."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.ended, self.ending = time.perf_counter(), ending
        m, method, series = self.metrics, self.method, self.series
        if method == "Prefill":  # PrefillDone carries the prompt's first token
            series.ttft.observe(self.ended - self.arrived)
        if self.started is not None:
            series.queue_time.observe(self.started - self.arrived)
            if self.token_times and method != "Decode":
                series.prefill_time.observe(self.token_times[0] - self.started)
        if self.token_times:
            series.decode_time.observe(self.token_times[-1] - self.token_times[0])
        if method != "Decode":
            series.prompt_length.observe(self.prompt_tokens)
        if method == "Prefill":
            return
        began = self.started is not None or bool(self.token_times) or self.tally.forwards > 0
        for record in self.sample_records():
            # A call refused or ended before its job began generated nothing: no sample to count.
            reason = record.finished.reason.name.lower() if record.finished is not None else ending * began
            if reason:
                series.output_length.observe(len(record.token_ids))
                m.finished.labels(method, reason).inc()

    def latency_ms(self, event: TokenOut) -> float:
        """Arrival to the first token, then the gap since the previous token (sample 0's; `see` has
        seen it, and maybe tokens after it: its index says which came before)."""
        previous = self.token_times[event.index - 1] if event.index else self.arrived
        return (event.at - previous) * 1000.0

    @property
    def text(self) -> str:
        return "".join(self.pieces) + (self.finished.tail if self.finished else "")

    @property
    def reason(self) -> Finish | None:
        return self.finished.reason if self.finished else None

    @property
    def queue_ms(self) -> float:
        return ((self.started or self.arrived) - self.arrived) * 1000.0

    @property
    def ttft_ms(self) -> float:
        return (self.token_times[0] - self.arrived) * 1000.0 if self.token_times else 0.0

    @property
    def total_ms(self) -> float:
        return ((self.ended or time.perf_counter()) - self.arrived) * 1000.0

    @property
    def inter_token_ms(self) -> list[float]:
        times = self.token_times
        return [(b - a) * 1000.0 for a, b in zip(times, times[1:], strict=False)]
