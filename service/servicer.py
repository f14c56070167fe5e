"""The typed servicer: protobuf in, plain requests to the engine worker, protobuf out.

Thin by design: each request is converted whole at the door into one typed call
(service/wire.py, service/calls.py) and checked as it is built; the model's
limits are checked in service/generation.py, the worker runs the job bodies
there, what calls share (sessions, a caller's share) lives in service/serving.py,
failures become statuses in the interceptor.
A Prefill is all or nothing: one that does not finish (an error, cancellation,
deadline or disconnect) closes the session it opened, or rewinds the session
it extended to the length it found. gRPC ends a Prefill's request stream alike
when the client half-closes, cancels or goes away, so a Prefill has finished
only once gRPC has taken its `done` event: a write to an ended call fails, and
the handler is then closed at that yield instead of resuming.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from engine.errors import InvalidInput
from engine.executor.step import Stats
from proto.ladder.v1 import ladder_pb2 as pb
from proto.ladder.v1 import ladder_pb2_grpc
from service import wire
from service.calls import ForkCall, GenerateCall, Prompt, check_response_fits
from service.core import Core, DecodeOrder
from service.errors import Cancelled, TooLarge
from service.events import ForwardDone, TokenOut
from service.generating import generation, text_door, watches
from service.generation import (
    close_body,
    fork_body,
    peek_body,
    prefill_body,
    rewind_body,
)
from service.interceptors.call_context import CALL, CALLER, REQUEST_ID
from service.progress import Progress
from service.serving import Extension, Serving, note_session
from service.sessions import ForkOrigin, SessionState
from service.tool_calls import ToolRequest, tools_at_fault

# Handlers never read or write messages through the context, so its message types stay open.
Context = grpc.aio.ServicerContext[Any, Any]
M = TypeVar("M", bound=Message)


class LadderServicer(ladder_pb2_grpc.LadderServicer):
    """The Ladder RPCs over what `serving()` returns: the server's Serving once its model has loaded
    (until then the interceptor's gate refuses every call, so no handler runs without one)."""

    def __init__(self, serving: Callable[[], Serving]) -> None:
        self._serving = serving

    @property
    def serving(self) -> Serving:
        return self._serving()

    # -- generation ---------------------------------------------------------------
    async def _generate(
        self, call: GenerateCall, tools: ToolRequest | None, unary: bool = False
    ) -> AsyncGenerator[tuple[list[Any], Progress], None]:
        with tools_at_fault(tools, "prompt.chat.tools"):
            async with aclosing(generation(self.serving, call, unary)) as steps:
                async for step in steps:
                    yield step

    async def Generate(self, request: pb.GenerateRequest, context: Context) -> pb.Completion:
        progress = None
        call, tools = wire.generate_with_tools(request, self.serving.tool_format())
        async with aclosing(self._generate(call, tools, unary=True)) as steps:
            async for step in steps:
                progress = step[1]
        assert progress is not None
        return self._within_limit(
            wire.completion(progress, REQUEST_ID.get(), text_of=self.serving.model.token_text, tools=tools)
        )

    async def GenerateStream(
        self, request: pb.GenerateRequest, context: Context
    ) -> AsyncIterator[pb.TokenEvent]:
        call, tools = wire.generate_with_tools(request, self.serving.tool_format())
        async with aclosing(self._generate(call, tools)) as steps:
            async for events, progress in steps:
                for message in self._token_events(events, progress, request.coalesce_tokens):
                    yield message
                if progress.ended is not None:  # every sample has finished: nothing comes after
                    yield self._within_limit(
                        pb.TokenEvent(
                            done=wire.completion(
                                progress, REQUEST_ID.get(), text_of=self.serving.model.token_text, tools=tools
                            )
                        )
                    )

    def _within_limit(self, message: M) -> M:
        """`message`, or TooLarge when it is over the message limit (the request's smallest answer
        fitted, its tokens' text and alternatives did not): the client hears why, the call counts
        as failed, and the work done is counted as for any call (service/progress.py)."""
        limit = self.serving.config.max_message_bytes
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
        text_of = self.serving.model.token_text
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
        call, serving = wire.prefill_call(first), self.serving
        sampler = call.sampler()
        extension = await serving.extension(call.session_id)
        state, progress, kept = extension.state, serving.progress(), False
        with serving.sessions.using(state):
            try:
                prompt: Prompt | None
                prompt, last = call.prompt, call.last
                while True:
                    if prompt is not None:
                        async with aclosing(self._prefill_part(extension, prompt, progress)) as events:
                            async for event in events:
                                yield event
                    if last:
                        break
                    part = await anext(parts, None)  # None also when the client cancelled or left
                    if part is None:
                        break
                    prompt, last = wire.prefill_part(part)
                result = await serving.scheduler.result(peek_body(state, sampler))
                progress.close()
                done = wire.prefill_done(state.id, result, serving.model.piece(result.next_token), progress)
                if not last:
                    # The messages ended, which they also do when the client cancelled or left
                    # mid-prompt: the extension is kept only once "done" went through.
                    yield done
                kept = True
            finally:
                if not kept:
                    serving.undo(extension)
        if last:
            # The client said where the prompt ends: kept and released before it hears "done", so
            # it may act on it at once, even cancel this call first.
            yield done

    async def _prefill_part(
        self, extension: Extension, prompt: Prompt, progress: Progress
    ) -> AsyncGenerator[pb.PrefillEvent, None]:
        serving, state = self.serving, extension.state
        tokens = await serving.prompt_ids(prompt)
        progress.prompt_tokens += len(tokens)
        body = extension.marked(prefill_body(state, tokens))
        async with aclosing(serving.scheduler.stream(progress.counted(body))) as events:
            async for event in events:
                progress.see(event)
                if isinstance(event, ForwardDone):
                    yield wire.forward_event(state.id, event)

    async def Decode(self, request: pb.DecodeRequest, context: Context) -> AsyncIterator[pb.TokenEvent]:
        call, serving = wire.decode_call(request), self.serving
        wanted = serving.model.asked_tokens(call.stopping)  # budget() caps it by the room left, later
        check_response_fits(wanted, 1, call.logprobs, 0, serving.config.max_message_bytes)
        order = DecodeOrder(
            call.session_id,
            call.sampling,
            call.stopping,
            call.logprobs,
            call.constraint,
            call.speculate,
            CALLER.get(),
            watches(serving, call.stopping),
        )
        core_call = Core(serving).decode(order)
        door = text_door(serving, call.stopping, core_call, ends_at_cut=False)
        progress, done = serving.progress(), None
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
                                progress, REQUEST_ID.get(), call.session_id, serving.model.token_text
                            )
                        )
                    )
        # The core released the session before its events ended, so the client's next call on it,
        # made once it hears "done", is never ABORTED.
        if done is not None:
            yield done

    async def Rewind(self, request: pb.RewindRequest, context: Context) -> pb.RewindResponse:
        serving = self.serving
        state = note_session(serving.sessions.get(request.session_id, CALLER.get()))
        with serving.sessions.using(state):
            length = await serving.scheduler.result(rewind_body(state, request.length))
        return pb.RewindResponse(session_id=state.id, length=length)

    async def CloseSession(
        self, request: pb.CloseSessionRequest, context: Context
    ) -> pb.CloseSessionResponse:
        serving = self.serving
        state = note_session(serving.sessions.get(request.session_id, CALLER.get()))
        with serving.sessions.using(state):
            serving.sessions.remove(state)
            # Shielded: the slot returns even when the caller leaves before the worker has closed it.
            closing = asyncio.ensure_future(serving.scheduler.result(close_body(state, "closed")))
            length = await asyncio.shield(closing)
        return pb.CloseSessionResponse(session_id=state.id, length=length)

    async def ForkSession(self, request: pb.ForkSessionRequest, context: Context) -> pb.ForkSessionResponse:
        call, sessions, caller = wire.fork_call(request), self.serving.sessions, CALLER.get()
        named = sessions.fork_session_id(call.fork_id) if call.fork_id else ""
        if named and (made := sessions.made_fork(named, caller, call.session_id, call.length)) is not None:
            _note_source(call.session_id)  # a retry whose answer was lost: the fork made then, not another
            return _fork_answer(note_session(made), call.session_id, 0.0)
        if named:
            sessions.start_fork(named, caller)
        try:
            state, ms = await self._fork(call, named)
            await self._fork_taken(state, context, named)
        except BaseException:
            sessions.end_fork(named, caller)
            raise
        return _fork_answer(note_session(state), call.session_id, ms)

    async def _fork(self, call: ForkCall, session_id: str) -> tuple[SessionState, float]:
        """A new session of the caller's holding its session's first `call.length` tokens, named
        `session_id` ("": a random id), and the time the worker spent on it."""
        serving = self.serving
        source = serving.sessions.get(call.session_id, CALLER.get())
        _note_source(source.id)
        spent: list[float] = []
        generated: list[int] = []  # the source's Decode-chosen positions the fork holds

        async def forking(caller: str) -> Any:
            forked = await serving.scheduler.result(fork_body(source, call.length))
            spent.append(forked.ms)
            generated.extend(p for p in source.generated if p < forked.session.length)
            return forked.session

        with serving.sessions.using(source):
            state = await serving.claim(forking, session_id)
        state.generated = generated
        if session_id:
            state.fork_of = ForkOrigin(source.id, call.length, state.session.length)
        return state, spent[0]

    async def _fork_taken(self, state: SessionState, context: Context, named: str) -> None:
        """All or nothing: a fork whose call already ended (deadline, cancel, client gone) is closed.
        The handler can finish after its deadline without gRPC cancelling it (the event loop was
        busy), and then nothing marks the call cancelled: writing the headers is the test that is."""
        serving = self.serving
        try:
            await _check_client_stayed(context)
            remaining = context.time_remaining()
            # A deadline that passed while the loop was held need not have ended the call yet (the
            # headers then go out): its client has given up all the same, so nobody takes the fork.
            if remaining is not None and remaining <= 0:
                raise Cancelled("the call's deadline passed before its answer")
        except BaseException:
            serving.close_soon(state, "fork_not_taken")
            raise

        def ended(call: Any) -> None:
            if call.cancelled():
                serving.close_soon(state, "fork_not_taken")
            serving.sessions.end_fork(named, state.owner)  # a retry may be answered from now on

        # types-grpcio declares the callback's type as a plain class, not a Protocol: no function fits it.
        context.add_done_callback(ended)  # type: ignore[arg-type]

    # -- tokenizer and introspection ------------------------------------------------------
    async def Tokenize(self, request: pb.TokenizeRequest, context: Context) -> pb.TokenizeResponse:
        return pb.TokenizeResponse(ids=await self.serving.prompt_ids(wire.tokenize_prompt(request)))

    async def Detokenize(self, request: pb.DetokenizeRequest, context: Context) -> pb.DetokenizeResponse:
        return pb.DetokenizeResponse(text=self.serving.model.detokenize(list(request.ids), field="ids"))

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context: Context) -> pb.ModelInfo:
        return wire.model_info(self.serving.model, self.serving.config)

    async def GetEngineStats(self, request: pb.GetEngineStatsRequest, context: Context) -> pb.EngineStats:
        serving = self.serving
        stats = await serving.scheduler.run(Stats())
        serving.metrics.engine_stats(stats)
        return wire.engine_stats(
            stats,
            serving.scheduler.depth,
            serving.scheduler.waiting,
            serving.totals,
            parking=serving.model.session_memory > 0,
        )


def _note_source(source_id: str) -> None:
    """Name the session forked in the call's access-log line."""
    record = CALL.get()
    if record is not None:
        record.source_session = source_id


def _fork_answer(state: SessionState, source_id: str, ms: float) -> pb.ForkSessionResponse:
    """The answer of a ForkSession; a retry's is its first call's (the length the fork was made with)."""
    length = state.fork_of.length if state.fork_of is not None else state.session.length
    return pb.ForkSessionResponse(
        session_id=state.id, length=length, source_session_id=source_id, server_ms=ms
    )


async def _check_client_stayed(context: Context) -> None:
    """Raise Cancelled when the request stream ended because the call did (gRPC ends it alike on
    half-close, cancel and disconnect): sending the response headers fails on an ended call."""
    try:
        await context.send_initial_metadata(())
    except Exception as exc:  # noqa: BLE001 — any failure to write means the call has ended
        raise Cancelled("the call ended before its answer") from exc
