"""The wire: protobuf requests into the typed calls of service/calls.py, and results back into protobuf.

With stats_wire.py (what the server says of itself), the only module besides the servicer that
knows *_pb2. A request is converted
here whole, at the door, and checked as it is built (service/calls.py); the
rest of the service works on the typed value.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

from engine.chat_messages import ChatMessage, FunctionTool, ToolCall
from engine.errors import InvalidInput
from engine.sampling import SamplingParams, TokenLogprobs
from proto.ladder.v1 import ladder_pb2 as pb
from service.calls import (
    ConstraintSpec,
    DecodeCall,
    ForkCall,
    GenerateCall,
    LogprobRequest,
    PrefillCall,
    Prompt,
    Stopping,
)
from service.events import Finish, ForwardDone, PrefillFinished, PrefillTally, TokenOut
from service.front.progress import Progress
from service.front.tool_calls import (
    AUTO,
    NAMED,
    NONE,
    REQUIRED,
    TOOL_NAME,
    ToolChoice,
    ToolRequest,
    call_id,
    tools_at_fault,
)
from service.front.tool_formats import ToolFormat

_FINISH = {
    Finish.LENGTH: pb.FINISH_REASON_LENGTH,
    Finish.EOS: pb.FINISH_REASON_EOS,
    Finish.STOP: pb.FINISH_REASON_STOP,
    Finish.CAPACITY: pb.FINISH_REASON_CAPACITY,
}


def generate_call(request: pb.GenerateRequest) -> GenerateCall:
    return GenerateCall(
        prompt(request.prompt),
        stopping(request.stopping),
        sampling(request.sampling),
        max(request.n, 1),
        logprob_request(request),
        constraint(request),
        speculate=not request.HasField("speculate") or request.speculate,
    )


_MODE = pb.ToolChoice
TOOL_MODES = {
    _MODE.MODE_NONE: NONE,
    _MODE.MODE_AUTO: AUTO,
    _MODE.MODE_REQUIRED: REQUIRED,
    _MODE.MODE_FUNCTION: NAMED,
}


def _tools_refused(message: str, field: str) -> InvalidInput:
    return InvalidInput(message, reason="INVALID_TOOLS", field=field)


def generate_with_tools(
    request: pb.GenerateRequest, tool_format: ToolFormat
) -> tuple[GenerateCall, ToolRequest | None]:
    """The call, and its tools when its chat has some: a REQUIRED or FUNCTION choice's constraint
    becomes the call's (beside `constraint`: refused)."""
    call = generate_call(request)
    tools = tool_request(request, call.prompt.tools, tool_format)
    with tools_at_fault(tools, "prompt.chat.tools"):  # a call schema over the constraint limit
        called = tools.constraint() if tools is not None else None
    if called is None:
        return call, tools
    if call.constraint is not None:
        raise _tools_refused(
            "tool_choice REQUIRED or FUNCTION constrains the reply, and so does constraint: set one",
            "tool_choice",
        )
    return dataclasses.replace(call, constraint=called), tools


def tool_request(
    request: pb.GenerateRequest, tools: tuple[FunctionTool, ...], tool_format: ToolFormat
) -> ToolRequest | None:
    """The request's tool_choice over its chat's tools (unset: AUTO with tools, NONE without)."""
    message = request.tool_choice
    mode = TOOL_MODES.get(message.mode, AUTO if tools else NONE)
    if mode == NAMED and message.function not in {t.name for t in tools}:
        raise _tools_refused(
            f"tool_choice.function {message.function!r} names no tool of the chat", "tool_choice.function"
        )
    if mode != NONE and not tools:
        raise _tools_refused(f"tool_choice {mode} needs tools in prompt.chat.tools", "tool_choice")
    if not tools:
        return None
    parallel = message.parallel if message.HasField("parallel") else True
    choice = ToolChoice(mode, message.function if mode == NAMED else "")
    return ToolRequest(tools, choice, parallel, tool_format)


def decode_call(request: pb.DecodeRequest) -> DecodeCall:
    return DecodeCall(
        request.session_id,
        stopping(request.stopping),
        sampling(request.sampling),
        logprob_request(request),
        constraint(request),
        speculate=not request.HasField("speculate") or request.speculate,
    )


def fork_call(request: pb.ForkSessionRequest) -> ForkCall:
    return ForkCall(
        request.session_id, request.length if request.HasField("length") else None, request.fork_id
    )


def constraint(request: pb.GenerateRequest | pb.DecodeRequest) -> ConstraintSpec | None:
    """The request's structured-output constraint (None: free text)."""
    if not request.HasField("constraint"):
        return None
    message = request.constraint
    kind = message.WhichOneof("kind") or ""
    if kind == "choice":
        return ConstraintSpec(kind, options=tuple(message.choice.options))
    strict = message.strict if message.HasField("strict") else None
    return ConstraintSpec(kind, text=getattr(message, kind) if kind else "", strict=strict)


def prefill_call(first: pb.PrefillRequest) -> PrefillCall:
    """A Prefill's first message (its later messages carry a prompt part only: prefill_part)."""
    return PrefillCall(first.session_id, prompt(first.prompt), sampling(first.sampling), first.last)


def prefill_part(part: pb.PrefillRequest) -> tuple[Prompt | None, bool]:
    """A later Prefill message: its prompt part (None for a bare `last`), and whether it ends the
    prompt; naming a session there is refused."""
    if part.session_id:
        raise InvalidInput(
            "session_id belongs in the first Prefill message only; a later message names one",
            reason="SESSION_ID_NOT_FIRST",
            field="session_id",
        )
    if part.last and not part.HasField("prompt"):
        return None, True
    return prompt(part.prompt), part.last


def tokenize_prompt(request: pb.TokenizeRequest) -> Prompt:
    kind = request.WhichOneof("input")
    if kind is None:
        raise InvalidInput("Tokenize needs text or chat messages", reason="PROMPT_REQUIRED", field="text")
    if kind == "text":
        return Prompt(text=request.text)
    return Prompt(chat=chat(request.chat), tools=tools(request.chat))


def prompt(message: pb.Prompt) -> Prompt:
    kind = message.WhichOneof("input")
    if kind == "text":
        return Prompt(text=message.text)
    if kind == "chat":
        return Prompt(chat=chat(message.chat), tools=tools(message.chat))
    return Prompt(ids=tuple(message.tokens.ids))


def chat(message: pb.Chat) -> tuple[ChatMessage, ...]:
    return tuple(
        ChatMessage(
            m.role,
            m.content,
            tuple(ToolCall(c.id, c.name, c.arguments) for c in m.tool_calls),
            m.tool_call_id,
            m.name,
        )
        for m in message.messages
    )


def tools(message: pb.Chat) -> tuple[FunctionTool, ...]:
    """The chat's tools: each name 1 to 64 of a-z A-Z 0-9 _ -, unique; parameters a JSON object or empty."""
    found: list[FunctionTool] = []
    for i, tool in enumerate(message.tools):
        field = f"prompt.chat.tools[{i}]"
        if not TOOL_NAME.fullmatch(tool.name) or tool.name in {t.name for t in found}:
            raise _tools_refused(
                f"{field}.name must be 1 to 64 of a-z, A-Z, 0-9, _ and -, unique in the chat", f"{field}.name"
            )
        if tool.parameters and not _json_object(tool.parameters):
            raise _tools_refused(f"{field}.parameters is not a JSON object's text", f"{field}.parameters")
        found.append(FunctionTool(tool.name, tool.description, tool.parameters, tool.strict))
    return tuple(found)


def _json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def sampling(message: pb.SamplingOptions) -> SamplingParams:
    return SamplingParams(
        temperature=message.temperature,
        top_k=message.top_k,
        top_p=message.top_p if message.HasField("top_p") else 1.0,
        repetition_penalty=message.repetition_penalty if message.HasField("repetition_penalty") else 1.0,
        seed=message.seed if message.HasField("seed") else None,
        min_p=message.min_p,
        presence_penalty=message.presence_penalty,
        frequency_penalty=message.frequency_penalty,
    )


def stopping(message: pb.StoppingOptions) -> Stopping:
    return Stopping(
        message.max_new_tokens,
        tuple(message.stop),
        message.ignore_eos,
        frozenset(message.stop_token_ids),
        min_new_tokens=message.min_new_tokens,
    )


def summary(tally: PrefillTally) -> pb.PrefillSummary:
    return pb.PrefillSummary(
        forwards=tally.forwards,
        real_rows=tally.real_rows,
        padded_rows=tally.padded_rows,
        widths=tally.widths,
        shared_rows=tally.shared_rows,
    )


def logprob_request(request: pb.GenerateRequest | pb.DecodeRequest) -> LogprobRequest | None:
    if not request.HasField("logprobs"):
        return None
    return LogprobRequest(request.logprobs.top, request.logprobs.prompt)


def token_logprobs(found: TokenLogprobs, text_of: Callable[[int], str]) -> pb.TokenLogprobs:
    return pb.TokenLogprobs(id=found.token, logprob=found.logprob, top=alternatives(found, text_of))


def alternatives(found: TokenLogprobs, text_of: Callable[[int], str]) -> list[pb.Alternative]:
    return [pb.Alternative(id=i, text=text_of(i), logprob=v) for i, v in found.top]


def token(event: TokenOut, latency_ms: float, text_of: Callable[[int], str]) -> pb.Token:
    token = pb.Token(
        id=event.id, text=event.text, index=event.index, latency_ms=latency_ms, sample=event.sample
    )
    if event.logprobs is not None:
        token.logprob = event.logprobs.logprob
        token.top_logprobs.extend(alternatives(event.logprobs, text_of))
    return token


def samples(
    progress: Progress, text_of: Callable[[int], str], tools: ToolRequest | None = None
) -> list[pb.Sample]:
    unfinished = pb.FINISH_REASON_UNSPECIFIED
    found = [
        pb.Sample(
            index=i,
            text=r.text,
            token_ids=r.token_ids,
            finish_reason=_FINISH[r.finished.reason] if r.finished else unfinished,
            logprobs=[token_logprobs(t, text_of) for t in r.logprobs],
        )
        for i, r in enumerate(progress.sample_records())
    ]
    for sample in found:
        _read_calls(sample, tools)
    return found


def _read_calls(answer: pb.Completion | pb.Sample, tools: ToolRequest | None) -> None:
    """The calls `tools` read from the answer's text, and the text before them."""
    parsed = tools.read(answer.text) if tools is not None else None
    if parsed is None or not parsed.calls:
        return
    answer.content = parsed.content
    answer.tool_calls.extend(
        pb.ToolCall(id=call_id(), name=c.name, arguments=c.arguments) for c in parsed.calls
    )


def completion(
    progress: Progress,
    request_id: str,
    session_id: str | None = None,
    text_of: Callable[[int], str] = lambda _: "",
    tools: ToolRequest | None = None,
) -> pb.Completion:
    timing = pb.Timing(
        queue_ms=progress.queue_ms,
        ttft_ms=progress.ttft_ms,
        total_ms=progress.total_ms,
        inter_token_ms=progress.inter_token_ms,
    )
    reason = _FINISH[progress.reason] if progress.reason else pb.FINISH_REASON_UNSPECIFIED
    done = pb.Completion(
        text=progress.text,
        token_ids=progress.token_ids,
        finish_reason=reason,
        timing=timing,
        usage=pb.Usage(prompt_tokens=progress.prompt_tokens, completion_tokens=progress.generated),
        request_id=request_id,
        logprobs=[token_logprobs(t, text_of) for t in progress.logprobs],
        prompt_logprobs=[token_logprobs(t, text_of) for t in progress.prompt_logprobs],
    )
    if progress.samples > 1:
        done.samples.extend(samples(progress, text_of, tools))
        done.tool_calls.extend(done.samples[0].tool_calls)
        done.content = done.samples[0].content
    else:
        _read_calls(done, tools)
    if session_id is not None:
        done.session_id = session_id
        done.session_length = progress.finished.session_length if progress.finished else 0
    else:
        done.prefill.CopyFrom(summary(progress.tally))
    return done


def forward_event(session_id: str, event: ForwardDone) -> pb.PrefillEvent:
    return pb.PrefillEvent(
        forward=pb.ForwardEvent(
            session_id=session_id,
            real_rows=event.real_rows,
            width=event.width,
            past=event.past,
            length=event.length,
        )
    )


def prefill_done(session_id: str, result: PrefillFinished, text: str, progress: Progress) -> pb.PrefillEvent:
    timing = pb.Timing(queue_ms=progress.queue_ms, total_ms=progress.total_ms)
    return pb.PrefillEvent(
        done=pb.PrefillDone(
            session_id=session_id,
            length=result.length,
            next_token=result.next_token,
            next_token_text=text,
            summary=summary(progress.tally),
            timing=timing,
        )
    )
