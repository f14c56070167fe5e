"""What a loaded engine is, fixed at load: the one value the service reads instead of reaching into
the engine's parts (its pool, its model info, its options)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineFacts:
    provider: str  # "cpu" or "cuda": the backend that runs the forwards
    capacity: int  # tokens one session holds (KV positions of a slot)
    chunk_size: int  # the widest prefill forward
    ladder: tuple[int, ...]  # the widths prefill forwards are padded onto (none: padding is off)
    slots: int  # KV slots: sessions open at once
    batch_widths: tuple[int, ...]  # decode forward widths (none: each session decodes alone)
    variant_capacity: int  # shape variants kept prepared
    padding: bool  # query-axis padding is on for this model
    recurrent: bool  # the decoder carries recurrent state (no rewind but to 0, no fork, no copy)
    token_ids_only: bool  # the model is fed token ids and nothing else (decode by token, share prefixes)
    unbatched_reason: str  # why decode does not batch sessions ("" when it does)
    vocab_size: int  # the logits row width
    eos_ids: tuple[int, ...]
    bos_id: int | None
    layers: int
    prompt_batch: int = 1  # new prompts one prefill forward may take (1: each prefills alone)
