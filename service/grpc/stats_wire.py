"""What the server says of itself, as protobuf: the model's facts and limits (GetModelInfo) and the
engine's counters (GetEngineStats). The requests' side of the wire is wire.py.
"""

from __future__ import annotations

from typing import Any

from proto.ladder.v1 import ladder_pb2 as pb


def model_info(model: Any, config: Any) -> pb.ModelInfo:
    facts = model.facts
    return pb.ModelInfo(
        model=model.name,
        vocab_size=facts.vocab_size,
        capacity=facts.capacity,
        chunk_size=facts.chunk_size,
        ladder=list(facts.ladder),
        execution_provider=facts.provider,
        padding_enabled=facts.padding,
        recurrent_state=facts.recurrent,
        eos_token_ids=list(facts.eos_ids),
        bos_token_id=-1 if facts.bos_id is None else facts.bos_id,
        num_layers=facts.layers,
        has_tokenizer=model.tokenizer is not None,
        max_sessions=facts.slots,
        variant_capacity=facts.variant_capacity,
        max_new_tokens_limit=model.max_new_tokens,
        max_prompt_tokens=model.max_prompt_tokens,
        pod_name=config.pod_name,
        batch_widths=list(facts.batch_widths),
        default_max_new_tokens=model.default_new_tokens,
    )


def engine_stats(
    stats: Any, queue_depth: int, waiting: int, totals: Any, parking: bool = False
) -> pb.EngineStats:
    v, m = stats.variants, stats.memory
    held = [
        pb.VariantEntry(width=e.key.width, ports=e.key.ports, bytes=e.nbytes, hits=e.hits, batch=e.key.batch)
        for e in v.entries
    ]
    d = stats.decode
    decode = pb.DecodeStats(
        steps=d.steps,
        rows=d.rows,
        ride_along_rows=d.ride_along_rows,
        widths=[pb.BatchWidthUse(batch=b, forwards=n) for b, n in d.widths],
        batch_widths=list(stats.batch_widths),
        unbatched_reason=stats.unbatched_reason,
        lookahead_hits=d.lookahead_hits,
        lookahead_misses=d.lookahead_misses,
        chained_steps=d.chained,
        rows_moved=d.rows_moved,
        verify_forwards=d.verify_forwards,
        drafted_tokens=d.drafted,
        accepted_tokens=d.accepted,
    )
    return pb.EngineStats(
        variants=pb.VariantStats(
            entries=len(v.entries),
            capacity=v.capacity,
            hits=v.hits,
            misses=v.misses,
            prepared=v.prepared,
            evictions=v.evictions,
            refusals=v.refusals,
            bytes=v.nbytes,
            held=held,
        ),
        memory=pb.MemoryUse(
            weights_bytes=m.weights,
            kv_bytes=m.kv,
            variant_bytes=m.variants,
            total_bytes=m.total,
            budget_bytes=m.budget,
        ),
        eager_forwards=stats.eager_forwards,
        sessions_open=stats.sessions_open,
        sessions_padding_off=stats.sessions_padding_off,
        slots_allocated=stats.slots_allocated,
        slot_bytes=stats.slot_bytes,
        queue_depth=queue_depth,
        prompt_tokens=totals.prompt_tokens,
        generated_tokens=totals.generated_tokens,
        padded_rows=totals.padded_rows,
        decode=decode,
        waiting_for_slot=waiting,
        prefix=prefix_stats(stats.prefix),
        parking=parking_stats(stats.parking, parking),
        prompt_batches=pb.PromptBatchStats(
            max_prompts=stats.prompt_batch, forwards=stats.prompt_forwards, prompts=stats.prompts_batched
        ),
        exactness=exactness_rules(stats.kernels),
    )


def exactness_rules(k: Any) -> pb.ExactnessRules | None:
    if k is None:
        return None
    return pb.ExactnessRules(
        restore_rule=k.restore_rule,
        least_decode_batch=k.least_decode_batch,
        measured=k.measured,
        one_row_gap=k.one_row_gap,
        re_run_gap=k.re_run_gap,
        verify_gap=k.verify_gap,
    )


def parking_stats(p: Any, enabled: bool) -> pb.ParkingStats:
    return pb.ParkingStats(
        enabled=enabled,
        sessions_parked=p.sessions_parked,
        parked_bytes=p.parked_bytes,
        parks=p.parks,
        unparks=p.unparks,
        park_seconds=p.park_seconds,
        unpark_seconds=p.unpark_seconds,
        released_bytes=p.released_bytes,
        device_bytes=p.device_bytes,
        spills=p.spills,
    )


def prefix_stats(p: Any) -> pb.PrefixStats:
    return pb.PrefixStats(
        enabled=p.enabled,
        lookups=p.lookups,
        hits=p.hits,
        tokens_saved=p.tokens_saved,
        forks=p.forks,
        slots_held=p.rows_held,
        bytes_held=p.bytes_held,
        evictions=p.evictions,
    )
