"""The typed servicer: protobuf in, plain requests to the engine worker, protobuf out.

Thin by design: prompts and limits are checked in service/generation.py, the
worker runs the job bodies there, failures become statuses in the interceptor.
A Prefill is all or nothing: one that does not finish (an error, cancellation,
deadline or disconnect) closes the session it opened, or rewinds the session
it extended to the length it found. gRPC ends a Prefill's request stream alike
when the client half-closes, cancels or goes away, so a Prefill has finished
only once gRPC has taken its `done` event: a write to an ended call fails, and
the handler is then closed at that yield instead of resuming.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import grpc
import structlog

from engine.executor.sampling import Sampler
from proto.ladder.v1 import ladder_pb2 as pb
from proto.ladder.v1 import ladder_pb2_grpc
from service import convert
from service.config import Config
from service.errors import Cancelled, Draining, InvalidRequest, LimitExceeded, QueueFull
from service.generation import (
    Finished,
    ForwardDone,
    Model,
    PrefillTally,
    TokenOut,
    check_sampling,
    close,
    decode_body,
    fork,
    generate_body,
    make_sampler,
    next_token,
    prefill_body,
    rewind,
)
from service.metrics import Metrics
from service.progress import Progress, Totals
from service.requests import Call
from service.scheduler import Body, Scheduler
from service.security import CALL, CALLER, REQUEST_ID
from service.sessions import SessionRegistry, SessionState

Context = grpc.aio.ServicerContext
log = structlog.get_logger("ladder.sessions")


def note_session(state: SessionState) -> SessionState:
    """Name the session in the call's access-log line."""
    record = CALL.get()
    if record is not None:
        record.session = state.id
    return state


def caller_share(configured: int, slots: int) -> int:
    """Sessions one caller may hold: `sessions_per_caller` when set, else every KV slot but one."""
    return configured or max(1, slots - 1)


@dataclass(eq=False)
class Extension:
    """What one Prefill does to its session: opens it, or extends it from `length` tokens.

    `length` is read on the worker when the Prefill's first part starts there (None until then:
    nothing has run), and the restore reads it on the worker after the Prefill's last job."""

    state: SessionState
    opened: bool
    length: int | None = None

    def marked(self, body: Body) -> Body:
        """`body`, noting first the length it finds the session at (on the worker)."""
        if self.length is None:
            self.length = self.state.session.length
        yield from body

    def restore(self, model: Model) -> None:
        """Rewind the session to the length the Prefill found it at (the logits follow)."""
        session = self.state.session
        if self.length is not None and not session.closed and session.length > self.length:
            model.engine.rewind(session, self.length)


@dataclass
class Runtime:
    config: Config
    model: Model
    scheduler: Scheduler
    sessions: SessionRegistry
    metrics: Metrics
    totals: Totals = field(default_factory=Totals)
    opening: Counter[str] = field(default_factory=Counter)  # sessions each caller waits for

    async def prompt_ids(self, prompt: pb.Prompt) -> list[int]:
        """The prompt's token ids, tokenized off the event loop (its size was bounded first)."""
        text, chat, ids = convert.prompt(prompt)
        if text is None and chat is None:
            return self.model.prompt_ids(text, chat, ids)
        return await asyncio.to_thread(self.model.prompt_ids, text, chat, ids)

    def progress(self, prompt_tokens: int = 0) -> Progress:
        """The call's record of its generation, timed from the call's arrival, in its access-log line."""
        record = CALL.get()
        arrived = record.arrived if record is not None else time.perf_counter()
        method = record.method if record is not None else ""
        progress = Progress(arrived, prompt_tokens, PrefillTally(), self.metrics, self.totals, method=method)
        if record is not None:
            record.progress = progress
        return progress

    def check_share(self, caller: str) -> None:
        """Refuse a caller who holds (or waits for) its share of the KV slots."""
        share = caller_share(self.config.sessions_per_caller, self.model.engine.pool.rows)
        held = sum(1 for s in self.sessions.all() if s.owner == caller) + self.opening[caller]
        if held >= share:
            raise QueueFull(f"this caller already holds {held} sessions (the limit is {share}; "
                            "see --sessions-per-caller)", reason="CALLER_QUOTA")

    def scope(self, caller: str) -> str:
        """Whose held prefixes a caller's prompts may start from: its own, unless the operator
        lets callers that auth tells apart share them (a shared prefix's speed is visible to others)."""
        return "" if self.config.prefix_across_callers else caller

    def check_samples(self, n: int) -> None:
        """n samples hold n KV slots at once: no more than the server has, nor than the caller's share
        beside the sessions it holds."""
        engine = self.model.engine
        if n > engine.pool.rows:
            raise LimitExceeded(f"n = {n} samples need {n} KV slots at once; the server has "
                                f"{engine.pool.rows}", reason="TOO_MANY_SAMPLES", field="n")
        if n > 1 and engine.info.recurrent_state:
            raise InvalidRequest("n > 1 copies the prompt's KV rows, and this decoder carries "
                                 "recurrent state that has none", reason="SAMPLES_UNSUPPORTED", field="n")
        if n > 1:
            caller = CALLER.get()
            share = caller_share(self.config.sessions_per_caller, engine.pool.rows)
            held = sum(1 for s in self.sessions.all() if s.owner == caller) + self.opening[caller]
            if held + n > share:
                raise QueueFull(f"n = {n} samples beside the {held} sessions this caller holds are over its "
                                f"share of {share} KV slots (see --sessions-per-caller)",
                                reason="CALLER_QUOTA")

    async def open_session(self) -> SessionState:
        return await self.claim(lambda caller: self.scheduler.open_session(self.scope(caller)))

    async def claim(self, opening: Callable[[str], Awaitable[Any]]) -> SessionState:
        """A new session for the caller, within its share, from `opening(caller)` (an engine Session)."""
        caller = CALLER.get()
        self.check_share(caller)
        self.opening[caller] += 1
        try:
            # Waits in the bounded queue while every KV slot is taken.
            task = asyncio.ensure_future(opening(caller))
            try:
                session = await asyncio.shield(task)
            except asyncio.CancelledError:  # the caller left while the slot was being taken: give it back
                task.add_done_callback(self._close_orphan)
                raise
        finally:
            self.opening[caller] -= 1
        state = SessionState(self.sessions.new_id(), caller, session)
        self.sessions.add(state)
        log.info("session_opened", session=state.id, caller=caller, sessions_open=len(self.sessions))
        return state

    async def extension(self, session_id: str) -> Extension:
        """What a Prefill works on: a new session (no id) or the caller's own."""
        if not session_id:
            return Extension(note_session(await self.open_session()), opened=True)
        return Extension(note_session(self.sessions.get(session_id, CALLER.get())), opened=False)

    def _close_orphan(self, opening: asyncio.Future[Any]) -> None:
        if not opening.cancelled() and opening.exception() is None:
            self.close_soon(SessionState("", "", opening.result()))

    def close_soon(self, state: SessionState, reason: str = "") -> None:
        """Forget the session and return its KV slot on the worker (safe inside a cancelled call)."""
        self.sessions.remove(state)
        if reason:
            self._soon(lambda: session_closed(state, reason, close(self.model, state)))
        else:
            self._soon(lambda: close(self.model, state))

    def undo(self, extension: Extension) -> None:
        """Put the session back as an unfinished Prefill found it: closed if it opened it, else
        rewound on the worker, after the Prefill's own jobs have ended. A decoder with recurrent
        state rewinds only to 0: its session is closed instead."""
        if extension.opened or self.model.engine.info.recurrent_state:
            self.close_soon(extension.state, "prefill_unfinished")
        else:
            self._soon(lambda: extension.restore(self.model))

    def _soon(self, fn: Any) -> None:
        """Run `fn` on the worker after every job submitted before it, without waiting for it."""
        def body() -> Generator[Any, Any, None]:
            yield Call(fn)

        try:
            self.scheduler.submit(body(), bounded=False)
        except Draining:  # the server is stopping: its sessions go with it
            pass


class LadderServicer(ladder_pb2_grpc.LadderServicer):
    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime

    # -- generation ---------------------------------------------------------------
    async def _generate(self, request: pb.GenerateRequest,
                        unary: bool = False) -> AsyncIterator[tuple[Any, Progress]]:
        model = self.rt.model
        tokens = await self.rt.prompt_ids(request.prompt)
        stopping = model.budget(convert.stopping(request.stopping), len(tokens))
        n = max(request.n, 1)
        self.rt.check_samples(n)  # before anything is built per sample
        params, logprobs = convert.sampling(request.sampling), convert.logprob_request(request)
        samplers = [make_sampler(params.for_sample(i), logprobs) for i in range(n)]
        progress = self.rt.progress(len(tokens))
        progress.samples = n
        prompt_top = logprobs.top if logprobs is not None and logprobs.prompt else None
        body = generate_body(model, tokens, samplers, stopping, progress.tally, self.rt.scope(CALLER.get()),
                             prompt_top)
        async with aclosing(self.rt.scheduler.stream(body, hold=unary)) as events:
            async for event in events:
                progress.see(event)
                yield event, progress

    async def Generate(self, request: pb.GenerateRequest, context: Context) -> pb.Completion:
        progress = None
        async with aclosing(self._generate(request, unary=True)) as steps:
            async for step in steps:
                progress = step[1]
        assert progress is not None
        return convert.completion(progress, REQUEST_ID.get(), text_of=self.rt.model.token_text)

    async def GenerateStream(self, request: pb.GenerateRequest,
                             context: Context) -> AsyncIterator[pb.TokenEvent]:
        async with aclosing(self._generate(request)) as steps:
            async for event, progress in steps:
                if isinstance(event, TokenOut):
                    yield self._token_event(event, progress)
                elif isinstance(event, Finished) and progress.ended is not None:  # every sample has
                    yield pb.TokenEvent(done=convert.completion(progress, REQUEST_ID.get(),
                                                                text_of=self.rt.model.token_text))

    def _token_event(self, event: TokenOut, progress: Progress) -> pb.TokenEvent:
        latency = progress.latency_ms(event) if event.sample == 0 else 0.0
        return convert.token_event(event, latency, self.rt.model.token_text)

    # -- sessions -----------------------------------------------------------------------
    async def Prefill(self, request_iterator: AsyncIterator[pb.PrefillRequest],
                      context: Context) -> AsyncIterator[pb.PrefillEvent]:
        parts = aiter(request_iterator)
        first = await anext(parts, None)
        if first is None or not first.HasField("prompt"):
            await _check_client_stayed(context)
            raise InvalidRequest("Prefill needs at least one message with a prompt", reason="PROMPT_REQUIRED",
                                 field="prompt")
        sampler = Sampler(check_sampling(convert.sampling(first.sampling)))
        extension = await self.rt.extension(first.session_id)
        state, progress, finished = extension.state, self.rt.progress(), False
        with self.rt.sessions.using(state):
            try:
                part: pb.PrefillRequest | None = first
                while part is not None:
                    async with aclosing(self._prefill_part(extension, part, progress)) as events:
                        async for event in events:
                            yield event
                    part = await anext(parts, None)  # None also when the client cancelled or left
                    if part is not None and part.session_id:
                        raise InvalidRequest("session_id belongs in the first Prefill message only; a later "
                                             "message names one", reason="SESSION_ID_NOT_FIRST",
                                             field="session_id")
                # A client that cancels or leaves mid-prompt ends the messages as a finished one does;
                # its call is cancelled at the next await, this one, so its extension is undone.
                result = await self.rt.scheduler.call(lambda: next_token(self.rt.model, state, sampler))
                progress.close()
                # Kept from here on: a client may act on "done" (and cancel the call) before the write
                # below has returned here, and the session it was told about must still be there. A
                # client leaving in the instant between these two lines leaves a session nobody knows;
                # the idle timeout returns its slot.
                finished = True
                yield convert.prefill_done(state.id, result, progress)
            finally:
                if not finished:
                    self.rt.undo(extension)

    async def _prefill_part(self, extension: Extension, part: pb.PrefillRequest,
                            progress: Progress) -> AsyncIterator[pb.PrefillEvent]:
        model, state = self.rt.model, extension.state
        tokens = await self.rt.prompt_ids(part.prompt)
        progress.prompt_tokens += len(tokens)
        body = extension.marked(prefill_body(model, state, tokens, progress.tally))
        async with aclosing(self.rt.scheduler.stream(body)) as events:
            async for event in events:
                if isinstance(event, ForwardDone):
                    yield convert.forward(state.id, event)

    async def Decode(self, request: pb.DecodeRequest, context: Context) -> AsyncIterator[pb.TokenEvent]:
        state = note_session(self.rt.sessions.get(request.session_id, CALLER.get()))
        done = None
        with self.rt.sessions.using(state):
            logprobs = convert.logprob_request(request)
            if logprobs is not None and logprobs.prompt:
                raise InvalidRequest("Decode has no prompt: logprobs.prompt is for Generate and "
                                     "GenerateStream", reason="INVALID_LOGPROBS", field="logprobs.prompt")
            sampler = make_sampler(convert.sampling(request.sampling), logprobs)
            body = decode_body(self.rt.model, state, sampler, convert.stopping(request.stopping))
            progress = self.rt.progress()
            async with aclosing(self.rt.scheduler.stream(body)) as events:
                async for event in events:
                    progress.see(event)
                    if isinstance(event, TokenOut):
                        yield self._token_event(event, progress)
                    elif isinstance(event, Finished):
                        done = pb.TokenEvent(done=convert.completion(progress, REQUEST_ID.get(), state,
                                                                     self.rt.model.token_text))
        # Released before the client hears "done", so its next call on the session is never ABORTED.
        if done is not None:
            yield done

    async def Rewind(self, request: pb.RewindRequest, context: Context) -> pb.RewindResponse:
        state = note_session(self.rt.sessions.get(request.session_id, CALLER.get()))
        with self.rt.sessions.using(state):
            length = await self.rt.scheduler.call(lambda: rewind(self.rt.model, state, request.length))
        return pb.RewindResponse(session_id=state.id, length=length)

    async def CloseSession(self, request: pb.CloseSessionRequest,
                           context: Context) -> pb.CloseSessionResponse:
        state = note_session(self.rt.sessions.get(request.session_id, CALLER.get()))
        with self.rt.sessions.using(state):
            self.rt.sessions.remove(state)
            # Shielded: the slot returns even when the caller leaves before the worker has closed it.
            closing = asyncio.ensure_future(self.rt.scheduler.call(
                lambda: session_closed(state, "closed", close(self.rt.model, state))))
            length = await asyncio.shield(closing)
        return pb.CloseSessionResponse(session_id=state.id, length=length)

    async def ForkSession(self, request: pb.ForkSessionRequest, context: Context) -> pb.ForkSessionResponse:
        source = self.rt.sessions.get(request.session_id, CALLER.get())
        length = request.length if request.HasField("length") else None
        spent: list[float] = []

        async def forking(caller: str) -> Any:
            forked = await self.rt.scheduler.call(lambda: fork(self.rt.model, source, length))
            spent.append(forked.ms)
            return forked.session

        with self.rt.sessions.using(source):
            state = await self.rt.claim(forking)
        return pb.ForkSessionResponse(session_id=state.id, length=state.session.length,
                                      source_session_id=source.id, server_ms=spent[0])

    # -- tokenizer and introspection ------------------------------------------------------
    async def Tokenize(self, request: pb.TokenizeRequest, context: Context) -> pb.TokenizeResponse:
        kind = request.WhichOneof("input")
        if kind is None:
            raise InvalidRequest("Tokenize needs text or chat messages", reason="PROMPT_REQUIRED",
                                 field="text")
        prompt = pb.Prompt(text=request.text) if kind == "text" else pb.Prompt(chat=request.chat)
        return pb.TokenizeResponse(ids=await self.rt.prompt_ids(prompt))

    async def Detokenize(self, request: pb.DetokenizeRequest, context: Context) -> pb.DetokenizeResponse:
        model = self.rt.model
        tokenizer = model.need_tokenizer("Detokenize")
        ids = model.check_ids(list(request.ids), field="ids") if request.ids else []
        # The streaming decoder, so Detokenize(ids) is exactly the text Generate streamed for them.
        return pb.DetokenizeResponse(text="".join(tokenizer.stream(skip_special=True).pieces(ids)))

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context: Context) -> pb.ModelInfo:
        return convert.model_info(self.rt.model, self.rt.config)

    async def GetEngineStats(self, request: pb.GetEngineStatsRequest, context: Context) -> pb.EngineStats:
        stats = await self.rt.scheduler.call(self.rt.model.engine.stats)
        self.rt.metrics.engine_stats(stats)
        scheduler = self.rt.scheduler
        return convert.engine_stats(stats, scheduler.depth, scheduler.waiting, self.rt.totals)


def session_closed(state: SessionState, reason: str, length: int) -> int:
    """Log the session's end (on the worker, where its length is read); the length."""
    log.info("session_closed", session=state.id, reason=reason, length=length)
    return length


async def _check_client_stayed(context: Context) -> None:
    """Raise Cancelled when the request stream ended because the call did (gRPC ends it alike on
    half-close, cancel and disconnect): sending the response headers fails on an ended call."""
    try:
        await context.send_initial_metadata(())
    except Exception as exc:  # noqa: BLE001 — any failure to write means the call has ended
        raise Cancelled("the client left before sending a prompt") from exc


