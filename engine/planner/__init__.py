"""The prefill planner: pure values, stdlib only.

It decides how a prompt appended to a session is cut into forwards (chunks),
at which query width each forward runs (the ladder), and whether padding may
be used at all, and onto which batch width a decode forward over several
sessions rounds. It imports neither onnxruntime nor numpy nor cupy; every
decision is a frozen value that the executor carries out and a test asserts.
"""

from engine.planner.batch import (
    PromptGroup,
    batch_widths,
    decode_batch_width,
    prompt_batches,
    prompt_groups,
    ride_along_length,
)
from engine.planner.ladder import (
    DEFAULT_CHUNK,
    chunk_width,
    ladder_widths,
    prefill_query_width,
    prefix_unit,
    step_for,
)
from engine.planner.padding import (
    PaddingDecision,
    PaddingPolicy,
    PortShape,
    decide_padding,
    is_per_token,
)
from engine.planner.plan import (
    CapacityExceeded,
    Forward,
    Limits,
    PrefillPlan,
    chunk_spans,
    plan_prefill,
)
from engine.planner.restore import fresh_after, last_span_start, recompute_from

__all__ = [
    "DEFAULT_CHUNK",
    "CapacityExceeded",
    "Forward",
    "Limits",
    "PaddingDecision",
    "PaddingPolicy",
    "PortShape",
    "PrefillPlan",
    "chunk_spans",
    "chunk_width",
    "decide_padding",
    "is_per_token",
    "batch_widths",
    "PromptGroup",
    "prompt_batches",
    "prompt_groups",
    "decode_batch_width",
    "ladder_widths",
    "plan_prefill",
    "fresh_after",
    "last_span_start",
    "recompute_from",
    "prefill_query_width",
    "prefix_unit",
    "ride_along_length",
    "step_for",
]
