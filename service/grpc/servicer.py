"""The typed servicer: protobuf in, plain requests to the engine worker, protobuf out.

Thin by design: each request is converted whole at the door into one typed call
(service/grpc/wire.py, service/calls.py) and checked as it is built; the model's
limits are checked in service/served_model.py, the core (service/core/core.py) runs the
job bodies of service/worker/generation.py, what calls share lives in service/front/front.py,
failures become statuses in the interceptor.
A Prefill is all or nothing: one that does not finish (an error, cancellation,
deadline or disconnect) closes the session it opened, or rewinds the session
it extended to the length it found. gRPC ends a Prefill's request stream alike
when the client half-closes, cancels or goes away, so a Prefill has finished
only once gRPC has taken its `done` event: a write to an ended call fails, and
the handler is then closed at that yield instead of resuming.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from engine.errors import InvalidInput
from proto.ladder.v1 import ladder_pb2 as pb
from proto.ladder.v1 import ladder_pb2_grpc
from service.calls import GenerateCall, Prompt, check_response_fits
from service.core.orders import (
    CloseOrder,
    CoreApi,
    DecodeOrder,
    ForkDone,
    ForkOrder,
    PrefillHandle,
    PrefillOrder,
    RewindOrder,
)
from service.door.call_context import CALL, CALLER, REQUEST_ID
from service.errors import Cancelled, TooLarge
from service.events import ForwardDone, TokenOut
from service.front.front import Front, note_session
from service.front.generating import generation, text_door
from service.front.progress import Progress
from service.front.texts import watches
from service.front.tool_calls import ToolRequest, tools_at_fault
from service.grpc import stats_wire, wire

# Handlers never read or write messages through the context, so its message types stay open.
Context = grpc.aio.ServicerContext[Any, Any]
M = TypeVar("M", bound=Message)


class LadderServicer(ladder_pb2_grpc.LadderServicer):
    """The Ladder RPCs over what `front()` returns: the server's Front once its model has loaded
    (until then the interceptor's gate refuses every call, so no handler runs without one)."""

    def __init__(self, front: Callable[[], Front]) -> None:
        self._front = front

    @property
    def front(self) -> Front:
        return self._front()

    @property
    def core(self) -> CoreApi:
        """Where the calls' orders go (service/core/orders.py)."""
        return self._front().core

    # -- generation ---------------------------------------------------------------
    async def _generate(
        self, call: GenerateCall, tools: ToolRequest | None, unary: bool = False
    ) -> AsyncGenerator[tuple[list[Any], Progress], None]:
        with tools_at_fault(tools, "prompt.chat.tools"):
            async with aclosing(generation(self.front, call, unary)) as steps:
                async for step in steps:
                    yield step

    async def Generate(self, request: pb.GenerateRequest, context: Context) -> pb.Completion:
        progress = None
        call, tools = wire.generate_with_tools(request, self.front.tool_format())
        async with aclosing(self._generate(call, tools, unary=True)) as steps:
            async for step in steps:
                progress = step[1]
        assert progress is not None
        return self._within_limit(
            wire.completion(progress, REQUEST_ID.get(), text_of=self.front.model.token_text, tools=tools)
        )

    async def GenerateStream(
        self, request: pb.GenerateRequest, context: Context
    ) -> AsyncIterator[pb.TokenEvent]:
        call, tools = wire.generate_with_tools(request, self.front.tool_format())
        async with aclosing(self._generate(call, tools)) as steps:
            async for events, progress in steps:
                for message in self._token_events(events, progress, request.coalesce_tokens):
                    yield message
                if progress.ended is not None:  # every sample has finished: nothing comes after
                    yield self._within_limit(
                        pb.TokenEvent(
                            done=wire.completion(
                                progress, REQUEST_ID.get(), text_of=self.front.model.token_text, tools=tools
                            )
                        )
                    )

    def _within_limit(self, message: M) -> M:
        """`message`, or TooLarge when it is over the message limit (the request's smallest answer
        fitted, its tokens' text and alternatives did not): the client hears why, the call counts
        as failed, and the work done is counted as for any call (service/core/counting.py)."""
        limit = self.front.config.max_message_bytes
        size = message.ByteSize()
        if size > limit:
            raise TooLarge(
                f"the answer is {size} bytes, over the message limit of {limit} bytes "
                "(--max-message-bytes): ask for fewer tokens, samples or alternatives",
                reason="RESPONSE_TOO_LARGE",
                field="stopping.max_new_tokens",
                metadata={"limit_bytes": str(limit), "bytes": str(size)},
            )
        return message

    def _token_events(self, events: list[Any], progress: Progress, coalesce: bool) -> list[pb.TokenEvent]:
        """The messages that carry these events' tokens: one each, or all in one (coalesce_tokens)."""
        text_of = self.front.model.token_text
        tokens = [
            wire.token(event, progress.latency_ms(event) if event.sample == 0 else 0.0, text_of)
            for event in events
            if isinstance(event, TokenOut)
        ]
        if coalesce:
            return [pb.TokenEvent(tokens=pb.Tokens(tokens=tokens))] if tokens else []
        return [pb.TokenEvent(token=token) for token in tokens]

    # -- sessions -----------------------------------------------------------------------
    async def Prefill(
        self, request_iterator: AsyncIterator[pb.PrefillRequest], context: Context
    ) -> AsyncIterator[pb.PrefillEvent]:
        parts = aiter(request_iterator)
        first = await anext(parts, None)
        if first is None or not first.HasField("prompt"):
            await _check_client_stayed(context)
            raise InvalidInput(
                "Prefill needs at least one message with a prompt", reason="PROMPT_REQUIRED", field="prompt"
            )
        call, front = wire.prefill_call(first), self.front
        order = PrefillOrder(call.session_id, call.sampling, CALLER.get(), REQUEST_ID.get())
        async with self.core.prefill(order) as session:
            note_session(session.session_id)
            progress = front.progress()
            prompt: Prompt | None
            prompt, last = call.prompt, call.last
            while True:
                if prompt is not None:
                    async with aclosing(self._prefill_part(session, prompt, progress)) as events:
                        async for event in events:
                            yield event
                if last:
                    break
                part = await anext(parts, None)  # None also when the client cancelled or left
                if part is None:
                    break
                prompt, last = wire.prefill_part(part)
            result = await session.peek()
            progress.close()
            done = wire.prefill_done(
                session.session_id, result, front.model.piece(result.next_token), progress
            )
            if not last:
                # The messages ended, which they also do when the client cancelled or left
                # mid-prompt: the extension is kept only once "done" went through.
                yield done
            session.keep()
        if last:
            # The client said where the prompt ends: kept and released before it hears "done", so
            # it may act on it at once, even cancel this call first.
            yield done

    async def _prefill_part(
        self, session: PrefillHandle, prompt: Prompt, progress: Progress
    ) -> AsyncGenerator[pb.PrefillEvent, None]:
        tokens = await self.front.prompt_ids(prompt)
        progress.prompt_tokens += len(tokens)
        async with aclosing(session.part(tokens)) as batches:
            async for events in batches:
                for event in events:
                    progress.see(event)
                    if isinstance(event, ForwardDone):
                        yield wire.forward_event(session.session_id, event)

    async def Decode(self, request: pb.DecodeRequest, context: Context) -> AsyncIterator[pb.TokenEvent]:
        call, front = wire.decode_call(request), self.front
        wanted = front.model.asked_tokens(call.stopping)  # budget() caps it by the room left, later
        check_response_fits(wanted, 1, call.logprobs, 0, front.config.max_message_bytes)
        note_session(call.session_id)
        order = DecodeOrder(
            call.session_id,
            call.sampling,
            call.stopping,
            logprobs=call.logprobs,
            constraint=call.constraint,
            speculate=call.speculate,
            caller=CALLER.get(),
            request_id=REQUEST_ID.get(),
            watching=watches(front.model.tokenizer, call.stopping),
        )
        core_call = self.core.decode(order)
        door = text_door(front, call.stopping, core_call, ends_at_cut=False)
        progress, done = front.progress(), None
        async with aclosing(core_call.events) as batches:
            async for raw in batches:
                events = door.see(raw)
                for event in events:
                    progress.see(event)
                for message in self._token_events(events, progress, request.coalesce_tokens):
                    yield message
                if progress.ended is not None:
                    done = self._within_limit(
                        pb.TokenEvent(
                            done=wire.completion(
                                progress, REQUEST_ID.get(), call.session_id, front.model.token_text
                            )
                        )
                    )
        # The core released the session before its events ended, so the client's next call on it,
        # made once it hears "done", is never ABORTED.
        if done is not None:
            yield done

    async def Rewind(self, request: pb.RewindRequest, context: Context) -> pb.RewindResponse:
        note_session(request.session_id)
        order = RewindOrder(request.session_id, request.length, CALLER.get(), REQUEST_ID.get())
        length = await self.core.rewind(order)
        return pb.RewindResponse(session_id=request.session_id, length=length)

    async def CloseSession(
        self, request: pb.CloseSessionRequest, context: Context
    ) -> pb.CloseSessionResponse:
        note_session(request.session_id)
        length = await self.core.close(CloseOrder(request.session_id, CALLER.get(), REQUEST_ID.get()))
        return pb.CloseSessionResponse(session_id=request.session_id, length=length)

    async def ForkSession(self, request: pb.ForkSessionRequest, context: Context) -> pb.ForkSessionResponse:
        call, core = wire.fork_call(request), self.core
        _note_source(call.session_id)
        order = ForkOrder(call.session_id, call.length, call.fork_id, CALLER.get(), REQUEST_ID.get())
        done = await core.fork(order)
        note_session(done.session_id)
        if not done.retry:  # a retry whose answer was lost gets the fork made then, not another
            await _fork_taken(core, done, context)
        return pb.ForkSessionResponse(
            session_id=done.session_id,
            length=done.length,
            source_session_id=done.source_session_id,
            server_ms=done.server_ms,
        )

    # -- tokenizer and introspection ------------------------------------------------------
    async def Tokenize(self, request: pb.TokenizeRequest, context: Context) -> pb.TokenizeResponse:
        return pb.TokenizeResponse(ids=await self.front.prompt_ids(wire.tokenize_prompt(request)))

    async def Detokenize(self, request: pb.DetokenizeRequest, context: Context) -> pb.DetokenizeResponse:
        return pb.DetokenizeResponse(text=self.front.model.detokenize(list(request.ids), field="ids"))

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context: Context) -> pb.ModelInfo:
        return stats_wire.model_info(self.front.model, self.front.config)

    async def GetEngineStats(self, request: pb.GetEngineStatsRequest, context: Context) -> pb.EngineStats:
        done = await self.core.stats()
        return stats_wire.engine_stats(
            done.stats, done.depth, done.waiting, done.totals, parking=done.parking
        )


def _note_source(source_id: str) -> None:
    """Name the session forked in the call's access-log line."""
    record = CALL.get()
    if record is not None:
        record.source_session = source_id


async def _fork_taken(core: CoreApi, done: ForkDone, context: Context) -> None:
    """All or nothing: a fork whose call already ended (deadline, cancel, client gone) is closed.
    The handler can finish after its deadline without gRPC cancelling it (the event loop was
    busy), and then nothing marks the call cancelled: writing the headers is the test that is."""
    try:
        await _check_client_stayed(context)
        remaining = context.time_remaining()
        # A deadline that passed while the loop was held need not have ended the call yet (the
        # headers then go out): its client has given up all the same, so nobody takes the fork.
        if remaining is not None and remaining <= 0:
            raise Cancelled("the call's deadline passed before its answer")
    except BaseException:
        core.fork_taken(done, taken=False)
        raise

    def ended(call: Any) -> None:
        core.fork_taken(done, taken=not call.cancelled())

    # types-grpcio declares the callback's type as a plain class, not a Protocol: no function fits it.
    context.add_done_callback(ended)  # type: ignore[arg-type]


async def _check_client_stayed(context: Context) -> None:
    """Raise Cancelled when the request stream ended because the call did (gRPC ends it alike on
    half-close, cancel and disconnect): sending the response headers fails on an ended call."""
    try:
        await context.send_initial_metadata(())
    except Exception as exc:  # noqa: BLE001 — any failure to write means the call has ended
        raise Cancelled("the call ended before its answer") from exc
