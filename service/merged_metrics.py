"""The server's metrics with its frontends' (`--frontends N`): each frontend process counts its calls
in a registry of its own; the server's registry (`MergedRegistry`) asks every frontend for its call
families (CALL_FAMILIES, as `call_families` gives them) when it is scraped and adds their samples to
its own, so /metrics counts every call once, wherever it was served.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

# What a call's side observes (a frontend process's share of the server's metrics).
CALL_FAMILIES = frozenset(
    {
        "ladder_calls",
        "ladder_call_seconds",
        "ladder_time_to_first_token_seconds",
        "ladder_inter_token_latency_seconds",
        "ladder_request_queue_seconds",
        "ladder_request_prefill_seconds",
        "ladder_request_decode_seconds",
        "ladder_request_prompt_tokens",
        "ladder_request_generated_tokens",
        "ladder_finished",
        "ladder_connections_refused",
        "ladder_connections_timed_out",
    }
)
# A family's samples as they cross between processes: (sample name, labels, value) each.
Families = list[tuple[str, list[tuple[str, dict[str, str], float]]]]


class MergedRegistry(CollectorRegistry):
    """A registry whose call families also hold the samples `others()` gives (the frontend
    processes' own, asked for as it is collected): counts and histogram buckets add up, a series'
    creation time is the earliest."""

    def __init__(self) -> None:
        super().__init__()
        self.others: Callable[[], list[Families]] = list

    def collect(self) -> Iterator[Metric]:
        extra: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
        for families in self.others():
            for name, samples in families:
                found = extra.setdefault(name, {})
                for sample, labels, value in samples:
                    key = (sample, tuple(sorted(labels.items())))
                    known = found.get(key)
                    found[key] = value if known is None else _combined(sample, known, value)
        for family in super().collect():
            more = extra.get(family.name)
            if more:
                family = _merged(family, more)
            yield family


def _combined(sample: str, ours: float, theirs: float) -> float:
    return min(ours, theirs) if sample.endswith("_created") else ours + theirs


def _merged(family: Metric, more: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> Metric:
    values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for sample in family.samples:
        values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    for key, value in more.items():
        known = values.get(key)
        values[key] = value if known is None else _combined(key[0], known, value)
    merged = Metric(family.name, family.documentation, family.type, family.unit)
    for (name, labels), value in values.items():
        merged.add_sample(name, dict(labels), value)
    return merged


def call_families(registry: CollectorRegistry) -> Families:
    """The call families of `registry`, as they cross to the server's process."""
    return [
        (family.name, [(s.name, dict(s.labels), float(s.value)) for s in family.samples])
        for family in registry.collect()
        if family.name in CALL_FAMILIES
    ]
