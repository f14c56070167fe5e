"""A generate call from its typed form to the core's events, whatever the protocol: gRPC's
Generate and GenerateStream (service/grpc/servicer.py) and the OpenAI-compatible API (service/http/)
both come through `generation`, so every limit is checked in one place.

The frontend's part is here: the prompt to token ids, the budget, the response's size, the text
and stop strings of the events (`TextDoor`); the rest is an order to the core (service/core/core.py).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from service.calls import GenerateCall, Stopping, check_response_fits
from service.core.orders import CoreCall, GenerateOrder
from service.door.call_context import CALLER, REQUEST_ID
from service.front.front import Front
from service.front.progress import Progress
from service.front.texts import TextDoor, watches


async def generation(
    front: Front, call: GenerateCall, unary: bool = False
) -> AsyncGenerator[tuple[list[Any], Progress], None]:
    """A generate call's events with its Progress. The events come in lists, every one that had
    arrived by the caller's turn (Scheduler.batches), and the Progress has seen them all."""
    tokens = await front.prompt_ids(call.prompt)
    stopping = front.model.budget(call.stopping, len(tokens))
    front.sample_limits(call.n)  # before anything is built per sample
    check_response_fits(
        stopping.max_new_tokens, call.n, call.logprobs, len(tokens), front.config.max_message_bytes
    )
    watching = watches(front.model.tokenizer, stopping)
    order = GenerateOrder(
        tuple(tokens),
        call.sampling,
        stopping,
        n=call.n,
        logprobs=call.logprobs,
        constraint=call.constraint,
        speculate=call.speculate,
        caller=CALLER.get(),
        request_id=REQUEST_ID.get(),
        watching=watching,
        unary=unary,
    )
    core_call = front.core.generate(order)
    progress = front.progress(len(tokens))
    progress.samples = call.n
    door = text_door(front, stopping, core_call, ends_at_cut=True)
    async with aclosing(core_call.events) as batches:
        async for raw in batches:
            events = door.see(raw)
            if not events:
                continue
            for event in events:
                progress.see(event)
            yield events, progress


def text_door(front: Front, stopping: Stopping, core_call: CoreCall, *, ends_at_cut: bool) -> TextDoor:
    """A call's samples from token ids to text, with the stop strings of `stopping`, its verdicts
    going to the core call."""
    return TextDoor(front.model.tokenizer, stopping, core_call.verdicts, ends_at_cut=ends_at_cut)
