"""The typed servicer: protobuf in, plain requests to the engine worker, protobuf out.

Thin by design: prompts and limits are checked in service/generation.py, the
worker runs the job bodies there, failures become statuses in the interceptor.
Sessions a call opens are returned to the pool whenever the call fails,
including cancellation, deadline and disconnect.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc

from engine.executor.sampling import Sampler
from proto.ladder.v1 import ladder_pb2 as pb
from proto.ladder.v1 import ladder_pb2_grpc
from service import convert
from service.config import Config
from service.errors import InvalidRequest
from service.generation import (
    Finished,
    ForwardDone,
    Model,
    PrefillTally,
    TokenOut,
    check_sampling,
    close,
    decode_body,
    generate_body,
    next_token,
    prefill_body,
    rewind,
)
from service.metrics import Metrics
from service.progress import Progress, Totals
from service.scheduler import Call, Scheduler
from service.security import CALLER, REQUEST_ID
from service.sessions import SessionRegistry, SessionState

Context = grpc.aio.ServicerContext


@dataclass
class Runtime:
    config: Config
    model: Model
    scheduler: Scheduler
    sessions: SessionRegistry
    metrics: Metrics
    totals: Totals = field(default_factory=Totals)

    def progress(self, prompt_tokens: int = 0) -> Progress:
        return Progress(time.perf_counter(), prompt_tokens, PrefillTally(), self.metrics, self.totals)

    async def open_session(self) -> SessionState:
        caller = CALLER.get()
        self.sessions.check_quota(caller)
        # Waits in the bounded queue while every KV slot is taken.
        opening = asyncio.ensure_future(self.scheduler.open_session())
        try:
            session = await asyncio.shield(opening)
        except asyncio.CancelledError:  # the caller left while the slot was being taken: give it back
            opening.add_done_callback(self._close_orphan)
            raise
        state = SessionState(self.sessions.new_id(), caller, session)
        self.sessions.add(state)
        self.metrics.sessions.set(len(self.sessions))
        return state

    def _close_orphan(self, opening: asyncio.Future[Any]) -> None:
        if not opening.cancelled() and opening.exception() is None:
            self.close_soon(SessionState("", "", opening.result()))

    def close_soon(self, state: SessionState) -> None:
        """Forget the session and return its KV slot on the worker (safe inside a cancelled call)."""
        self.sessions.remove(state)

        def body() -> Any:
            yield Call(lambda: close(self.model, state))

        self.scheduler.submit(body(), bounded=False)


class LadderServicer(ladder_pb2_grpc.LadderServicer):
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime

    # -- generation ---------------------------------------------------------------
    async def _generate(self, request: pb.GenerateRequest,
                        unary: bool = False) -> AsyncIterator[tuple[Any, Progress]]:
        model = self.rt.model
        tokens = model.prompt_ids(*convert.prompt(request.prompt))
        stopping = model.budget(convert.stopping(request.stopping), len(tokens))
        sampler = Sampler(check_sampling(convert.sampling(request.sampling)))
        progress = self.rt.progress(len(tokens))
        body = generate_body(model, tokens, sampler, stopping, progress.tally)
        async for event in self.rt.scheduler.stream(body, hold=unary):
            progress.see(event)
            yield event, progress

    async def Generate(self, request: pb.GenerateRequest, context: Context) -> pb.Completion:
        progress = None
        async for step in self._generate(request, unary=True):
            progress = step[1]
        assert progress is not None
        return convert.completion(progress, REQUEST_ID.get())

    async def GenerateStream(self, request: pb.GenerateRequest,
                             context: Context) -> AsyncIterator[pb.TokenEvent]:
        async for event, progress in self._generate(request):
            if isinstance(event, TokenOut):
                yield _token_event(event, progress)
            elif isinstance(event, Finished):
                yield pb.TokenEvent(done=convert.completion(progress, REQUEST_ID.get()))

    # -- sessions -----------------------------------------------------------------------
    async def Prefill(self, request_iterator: AsyncIterator[pb.PrefillRequest],
                      context: Context) -> AsyncIterator[pb.PrefillEvent]:
        parts = aiter(request_iterator)
        first = await anext(parts, None)
        if first is None or not first.HasField("prompt"):
            raise InvalidRequest("Prefill needs at least one message with a prompt")
        sampler = Sampler(check_sampling(convert.sampling(first.sampling)))
        opened = not first.session_id
        sessions = self.rt.sessions
        state = await self.rt.open_session() if opened else sessions.get(first.session_id, CALLER.get())
        progress = self.rt.progress()
        try:
            with self.rt.sessions.using(state):
                part: pb.PrefillRequest | None = first
                while part is not None:
                    async for event in self._prefill_part(state, part, progress):
                        yield event
                    part = await anext(parts, None)
                result = await self.rt.scheduler.call(lambda: next_token(self.rt.model, state, sampler))
            progress.close()
        except BaseException:
            if opened:
                self.rt.close_soon(state)
            raise
        # The session is released and kept before the client hears it is done: a client that
        # acts on PrefillDone at once (or cancels right after it) finds a usable session.
        yield convert.prefill_done(state.id, result, progress)

    async def _prefill_part(self, state: SessionState, part: pb.PrefillRequest,
                            progress: Progress) -> AsyncIterator[pb.PrefillEvent]:
        model = self.rt.model
        tokens = model.prompt_ids(*convert.prompt(part.prompt))
        progress.prompt_tokens += len(tokens)
        async for event in self.rt.scheduler.stream(prefill_body(model, state, tokens, progress.tally)):
            if isinstance(event, ForwardDone):
                yield convert.forward(state.id, event)

    async def Decode(self, request: pb.DecodeRequest, context: Context) -> AsyncIterator[pb.TokenEvent]:
        state = self.rt.sessions.get(request.session_id, CALLER.get())
        done = None
        with self.rt.sessions.using(state):
            sampler = Sampler(check_sampling(convert.sampling(request.sampling)))
            body = decode_body(self.rt.model, state, sampler, convert.stopping(request.stopping))
            progress = self.rt.progress()
            async for event in self.rt.scheduler.stream(body):
                progress.see(event)
                if isinstance(event, TokenOut):
                    yield _token_event(event, progress)
                elif isinstance(event, Finished):
                    done = pb.TokenEvent(done=convert.completion(progress, REQUEST_ID.get(), state))
        # Released before the client hears "done", so its next call on the session is never ABORTED.
        if done is not None:
            yield done

    async def Rewind(self, request: pb.RewindRequest, context: Context) -> pb.RewindResponse:
        state = self.rt.sessions.get(request.session_id, CALLER.get())
        with self.rt.sessions.using(state):
            length = await self.rt.scheduler.call(lambda: rewind(self.rt.model, state, request.length))
        return pb.RewindResponse(session_id=state.id, length=length)

    async def CloseSession(self, request: pb.CloseSessionRequest,
                           context: Context) -> pb.CloseSessionResponse:
        state = self.rt.sessions.get(request.session_id, CALLER.get())
        with self.rt.sessions.using(state):
            self.rt.sessions.remove(state)
            length = await self.rt.scheduler.call(lambda: close(self.rt.model, state))
        self.rt.metrics.sessions.set(len(self.rt.sessions))
        return pb.CloseSessionResponse(session_id=state.id, length=length)

    # -- tokenizer and introspection ------------------------------------------------------
    async def Tokenize(self, request: pb.TokenizeRequest, context: Context) -> pb.TokenizeResponse:
        kind = request.WhichOneof("input")
        if kind is None:
            raise InvalidRequest("Tokenize needs text or chat messages")
        prompt = pb.Prompt(text=request.text) if kind == "text" else pb.Prompt(chat=request.chat)
        return pb.TokenizeResponse(ids=self.rt.model.prompt_ids(*convert.prompt(prompt)))

    async def Detokenize(self, request: pb.DetokenizeRequest, context: Context) -> pb.DetokenizeResponse:
        model = self.rt.model
        tokenizer = model.need_tokenizer("Detokenize")
        ids = model.check_ids(list(request.ids)) if request.ids else []
        # The streaming decoder, so Detokenize(ids) is exactly the text Generate streamed for them.
        return pb.DetokenizeResponse(text="".join(tokenizer.stream(skip_special=True).pieces(ids)))

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context: Context) -> pb.ModelInfo:
        return convert.model_info(self.rt.model, self.rt.config)

    async def GetEngineStats(self, request: pb.GetEngineStatsRequest, context: Context) -> pb.EngineStats:
        stats = await self.rt.scheduler.call(self.rt.model.engine.stats)
        self.rt.metrics.engine_stats(stats)
        scheduler = self.rt.scheduler
        return convert.engine_stats(stats, scheduler.depth, scheduler.waiting, self.rt.totals)


def _token_event(event: TokenOut, progress: Progress) -> pb.TokenEvent:
    return pb.TokenEvent(token=pb.Token(id=event.id, text=event.text, index=event.index,
                                        latency_ms=progress.latency_ms(event)))
