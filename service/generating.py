"""A generate call from its typed form to the worker's events, whatever the protocol: gRPC's
Generate and GenerateStream (service/servicer.py) and the OpenAI-compatible API (service/http/)
both come through `generation`, so every limit is checked in one place."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from engine.sampling import Sampler
from service.calls import ConstraintSpec, GenerateCall, Stopping, check_response_fits
from service.generation import generate_body
from service.interceptors.call_context import CALLER
from service.min_tokens import ending_tokens, hold_ends
from service.progress import Progress
from service.serving import Serving
from service.texts import Cuts, TextDoor


async def generation(
    serving: Serving, call: GenerateCall, unary: bool = False
) -> AsyncGenerator[tuple[list[Any], Progress], None]:
    """A generate call's worker events with its Progress. The events come in lists, every one that
    had arrived by the caller's turn (Scheduler.batches), and the Progress has seen them all."""
    tokens = await serving.prompt_ids(call.prompt)
    stopping = serving.model.budget(call.stopping, len(tokens))
    width = serving.sample_width(call.n)  # before anything is built per sample
    check_response_fits(
        stopping.max_new_tokens, call.n, call.logprobs, len(tokens), serving.config.max_message_bytes
    )
    samplers = await prepared(serving, call.samplers(), stopping, call.constraint)
    progress = serving.progress(len(tokens))
    progress.samples = call.n
    door = text_door(serving, stopping, ends_at_cut=True)
    body = generate_body(
        serving.model,
        tokens,
        samplers,
        stopping,
        progress.tally,
        serving.scope(CALLER.get()),
        call.prompt_top,
        call.speculate,
        width,
        door.orders,
    )
    hold = unary and not door.watching  # a stop string found ends the job early: the events must come
    try:
        async with aclosing(serving.scheduler.batches(progress.counted(body), hold=hold)) as batches:
            async for raw in batches:
                events = door.see(raw)
                if not events:
                    continue
                for event in events:
                    progress.see(event)
                yield events, progress
    finally:
        constraint_time(serving, samplers)


def text_door(serving: Serving, stopping: Stopping, *, ends_at_cut: bool) -> TextDoor:
    """A call's samples from token ids to text, with the stop strings of `stopping`."""
    return TextDoor(serving.model.tokenizer, stopping, Cuts(serving.scheduler.wake), ends_at_cut=ends_at_cut)


async def prepared(
    serving: Serving, samplers: list[Sampler], stopping: Stopping, constraint: ConstraintSpec | None
) -> list[Sampler]:
    """The samplers, each with its own state of the call's constraint (compiled off the event loop
    and the worker, before the call asks for a KV slot), and min_new_tokens: the tokens that would
    end a sample masked out of its first choices."""
    rows = await serving.constraints.rows(constraint, len(samplers))
    for sampler, row in zip(samplers, rows, strict=True):
        sampler.constraint = row
    ends = ending_tokens(serving.model.eos_ids, stopping, constraint is not None)
    hold_ends(samplers, stopping.min_new_tokens, ends, serving.model.vocab_size)
    return samplers


def constraint_time(serving: Serving, samplers: list[Sampler]) -> None:
    """The time the samplers' constraints took per token, into the metric."""
    for sampler in samplers:
        tokens = sampler.counts.total()
        if sampler.constraint is not None and tokens:
            serving.metrics.constraint_mask.observe(sampler.constraint_seconds / tokens)
