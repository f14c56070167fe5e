"""Protobuf in, plain values out, and back: the only module besides the servicer that knows *_pb2."""

from __future__ import annotations

from typing import Any

from engine.executor.sampling import SamplingParams
from proto.ladder.v1 import ladder_pb2 as pb
from service.generation import ChatTurn, Finish, ForwardDone, PrefillFinished, PrefillTally, Stopping
from service.progress import Progress

_FINISH = {
    Finish.LENGTH: pb.FINISH_REASON_LENGTH, Finish.EOS: pb.FINISH_REASON_EOS,
    Finish.STOP: pb.FINISH_REASON_STOP, Finish.CAPACITY: pb.FINISH_REASON_CAPACITY,
}
PromptParts = tuple[str | None, list[ChatTurn] | None, list[int] | None]


def prompt(message: pb.Prompt) -> PromptParts:
    kind = message.WhichOneof("input")
    if kind == "text":
        return message.text, None, None
    if kind == "chat":
        return None, [ChatTurn(m.role, m.content) for m in message.chat.messages], None
    return None, None, list(message.tokens.ids)


def sampling(message: pb.SamplingOptions) -> SamplingParams:
    return SamplingParams(
        temperature=message.temperature, top_k=message.top_k,
        top_p=message.top_p if message.HasField("top_p") else 1.0,
        repetition_penalty=message.repetition_penalty if message.HasField("repetition_penalty") else 1.0,
        seed=message.seed if message.HasField("seed") else None)


def stopping(message: pb.StoppingOptions) -> Stopping:
    return Stopping(message.max_new_tokens, tuple(message.stop), message.ignore_eos,
                    frozenset(message.stop_token_ids))


def summary(tally: PrefillTally) -> pb.PrefillSummary:
    return pb.PrefillSummary(forwards=tally.forwards, real_rows=tally.real_rows,
                             padded_rows=tally.padded_rows, widths=tally.widths)


def completion(progress: Progress, request_id: str, session: Any | None = None) -> pb.Completion:
    timing = pb.Timing(queue_ms=progress.queue_ms, ttft_ms=progress.ttft_ms, total_ms=progress.total_ms,
                       inter_token_ms=progress.inter_token_ms)
    reason = _FINISH[progress.reason] if progress.reason else pb.FINISH_REASON_UNSPECIFIED
    done = pb.Completion(
        text=progress.text, token_ids=progress.token_ids, finish_reason=reason, timing=timing,
        usage=pb.Usage(prompt_tokens=progress.prompt_tokens, completion_tokens=len(progress.token_ids)),
        request_id=request_id)
    if session is not None:
        done.session_id = session.id
        done.session_length = progress.finished.session_length if progress.finished else 0
    else:
        done.prefill.CopyFrom(summary(progress.tally))
    return done


def forward(session_id: str, event: ForwardDone) -> pb.PrefillEvent:
    return pb.PrefillEvent(forward=pb.ForwardEvent(
        session_id=session_id, real_rows=event.real_rows, width=event.width, past=event.past,
        length=event.length))


def prefill_done(session_id: str, result: PrefillFinished, progress: Progress) -> pb.PrefillEvent:
    timing = pb.Timing(queue_ms=progress.queue_ms, total_ms=progress.total_ms)
    return pb.PrefillEvent(done=pb.PrefillDone(
        session_id=session_id, length=result.length, next_token=result.next_token,
        next_token_text=result.next_text, summary=summary(progress.tally), timing=timing))


def model_info(model: Any, config: Any) -> pb.ModelInfo:
    engine = model.engine
    info = engine.info
    return pb.ModelInfo(
        model=model.name, vocab_size=info.vocab_size, capacity=engine.capacity,
        chunk_size=engine.chunk_size, ladder=list(engine.padded_ladder),
        execution_provider=engine.backend.name,
        padding_enabled=bool(engine.options.padding and not info.recurrent_state),
        recurrent_state=info.recurrent_state, eos_token_ids=list(info.eos_token_ids),
        bos_token_id=-1 if info.bos_token_id is None else info.bos_token_id, num_layers=info.num_layers,
        has_tokenizer=model.tokenizer is not None, max_sessions=engine.pool.rows,
        variant_capacity=engine.variants.capacity, max_new_tokens_limit=model.max_new_tokens,
        max_prompt_tokens=model.max_prompt_tokens, pod_name=config.pod_name,
        batch_widths=list(engine.batch_widths), default_max_new_tokens=model.default_new_tokens)


def engine_stats(stats: Any, queue_depth: int, waiting: int, totals: Any) -> pb.EngineStats:
    v, m = stats.variants, stats.memory
    held = [pb.VariantEntry(width=e.key.width, ports=e.key.ports, bytes=e.nbytes, hits=e.hits,
                            batch=e.key.batch) for e in v.entries]
    d = stats.decode
    decode = pb.DecodeStats(steps=d.steps, rows=d.rows, ride_along_rows=d.ride_along_rows,
                            widths=[pb.BatchWidthUse(batch=b, forwards=n) for b, n in d.widths],
                            batch_widths=list(stats.batch_widths), unbatched_reason=stats.unbatched_reason,
                            lookahead_hits=d.lookahead_hits, lookahead_misses=d.lookahead_misses)
    return pb.EngineStats(
        variants=pb.VariantStats(entries=len(v.entries), capacity=v.capacity, hits=v.hits, misses=v.misses,
                                 prepared=v.prepared, evictions=v.evictions, refusals=v.refusals,
                                 bytes=v.nbytes, held=held),
        memory=pb.MemoryUse(weights_bytes=m.weights, kv_bytes=m.kv, variant_bytes=m.variants,
                            total_bytes=m.total, budget_bytes=m.budget),
        eager_forwards=stats.eager_forwards, sessions_open=stats.sessions_open,
        sessions_padding_off=stats.sessions_padding_off, slots_allocated=stats.slots_allocated,
        slot_bytes=stats.slot_bytes, queue_depth=queue_depth, prompt_tokens=totals.prompt_tokens,
        generated_tokens=totals.generated_tokens, padded_rows=totals.padded_rows, decode=decode,
        waiting_for_slot=waiting)
