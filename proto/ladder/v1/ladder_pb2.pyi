from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_EOS: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_CAPACITY: _ClassVar[FinishReason]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_EOS: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_CAPACITY: FinishReason

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content", "tool_calls", "tool_call_id", "name")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    tool_call_id: str
    name: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., tool_call_id: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("id", "name", "arguments")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    arguments: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class Tool(_message.Message):
    __slots__ = ("name", "description", "parameters", "strict")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters: str
    strict: bool
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters: _Optional[str] = ..., strict: _Optional[bool] = ...) -> None: ...

class Chat(_message.Message):
    __slots__ = ("messages", "tools")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    tools: _containers.RepeatedCompositeFieldContainer[Tool]
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., tools: _Optional[_Iterable[_Union[Tool, _Mapping]]] = ...) -> None: ...

class ToolChoice(_message.Message):
    __slots__ = ("mode", "function", "parallel")
    class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        MODE_UNSPECIFIED: _ClassVar[ToolChoice.Mode]
        MODE_NONE: _ClassVar[ToolChoice.Mode]
        MODE_AUTO: _ClassVar[ToolChoice.Mode]
        MODE_REQUIRED: _ClassVar[ToolChoice.Mode]
        MODE_FUNCTION: _ClassVar[ToolChoice.Mode]
    MODE_UNSPECIFIED: ToolChoice.Mode
    MODE_NONE: ToolChoice.Mode
    MODE_AUTO: ToolChoice.Mode
    MODE_REQUIRED: ToolChoice.Mode
    MODE_FUNCTION: ToolChoice.Mode
    MODE_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_FIELD_NUMBER: _ClassVar[int]
    mode: ToolChoice.Mode
    function: str
    parallel: bool
    def __init__(self, mode: _Optional[_Union[ToolChoice.Mode, str]] = ..., function: _Optional[str] = ..., parallel: _Optional[bool] = ...) -> None: ...

class Prompt(_message.Message):
    __slots__ = ("text", "chat", "tokens")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    text: str
    chat: Chat
    tokens: TokenIds
    def __init__(self, text: _Optional[str] = ..., chat: _Optional[_Union[Chat, _Mapping]] = ..., tokens: _Optional[_Union[TokenIds, _Mapping]] = ...) -> None: ...

class SamplingOptions(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "repetition_penalty", "seed", "min_p", "presence_penalty", "frequency_penalty")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    seed: int
    min_p: float
    presence_penalty: float
    frequency_penalty: float
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., seed: _Optional[int] = ..., min_p: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ...) -> None: ...

class LogprobOptions(_message.Message):
    __slots__ = ("top", "prompt")
    TOP_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    top: int
    prompt: bool
    def __init__(self, top: _Optional[int] = ..., prompt: _Optional[bool] = ...) -> None: ...

class StoppingOptions(_message.Message):
    __slots__ = ("max_new_tokens", "stop", "ignore_eos", "stop_token_ids", "min_new_tokens")
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    MIN_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    max_new_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    ignore_eos: bool
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    min_new_tokens: int
    def __init__(self, max_new_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., ignore_eos: _Optional[bool] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., min_new_tokens: _Optional[int] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompt", "sampling", "stopping", "n", "logprobs", "constraint", "coalesce_tokens", "tool_choice", "speculate")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    STOPPING_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    COALESCE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    SPECULATE_FIELD_NUMBER: _ClassVar[int]
    prompt: Prompt
    sampling: SamplingOptions
    stopping: StoppingOptions
    n: int
    logprobs: LogprobOptions
    constraint: Constraint
    coalesce_tokens: bool
    tool_choice: ToolChoice
    speculate: bool
    def __init__(self, prompt: _Optional[_Union[Prompt, _Mapping]] = ..., sampling: _Optional[_Union[SamplingOptions, _Mapping]] = ..., stopping: _Optional[_Union[StoppingOptions, _Mapping]] = ..., n: _Optional[int] = ..., logprobs: _Optional[_Union[LogprobOptions, _Mapping]] = ..., constraint: _Optional[_Union[Constraint, _Mapping]] = ..., coalesce_tokens: _Optional[bool] = ..., tool_choice: _Optional[_Union[ToolChoice, _Mapping]] = ..., speculate: _Optional[bool] = ...) -> None: ...

class Constraint(_message.Message):
    __slots__ = ("json_schema", "regex", "choice", "grammar", "strict")
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    json_schema: str
    regex: str
    choice: Choices
    grammar: str
    strict: bool
    def __init__(self, json_schema: _Optional[str] = ..., regex: _Optional[str] = ..., choice: _Optional[_Union[Choices, _Mapping]] = ..., grammar: _Optional[str] = ..., strict: _Optional[bool] = ...) -> None: ...

class Choices(_message.Message):
    __slots__ = ("options",)
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    options: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, options: _Optional[_Iterable[str]] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ...) -> None: ...

class Timing(_message.Message):
    __slots__ = ("queue_ms", "ttft_ms", "total_ms", "inter_token_ms")
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    INTER_TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    queue_ms: float
    ttft_ms: float
    total_ms: float
    inter_token_ms: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, queue_ms: _Optional[float] = ..., ttft_ms: _Optional[float] = ..., total_ms: _Optional[float] = ..., inter_token_ms: _Optional[_Iterable[float]] = ...) -> None: ...

class PrefillSummary(_message.Message):
    __slots__ = ("forwards", "real_rows", "padded_rows", "widths", "shared_rows")
    FORWARDS_FIELD_NUMBER: _ClassVar[int]
    REAL_ROWS_FIELD_NUMBER: _ClassVar[int]
    PADDED_ROWS_FIELD_NUMBER: _ClassVar[int]
    WIDTHS_FIELD_NUMBER: _ClassVar[int]
    SHARED_ROWS_FIELD_NUMBER: _ClassVar[int]
    forwards: int
    real_rows: int
    padded_rows: int
    widths: _containers.RepeatedScalarFieldContainer[int]
    shared_rows: int
    def __init__(self, forwards: _Optional[int] = ..., real_rows: _Optional[int] = ..., padded_rows: _Optional[int] = ..., widths: _Optional[_Iterable[int]] = ..., shared_rows: _Optional[int] = ...) -> None: ...

class Token(_message.Message):
    __slots__ = ("id", "text", "index", "latency_ms", "logprob", "top_logprobs", "sample")
    ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    id: int
    text: str
    index: int
    latency_ms: float
    logprob: float
    top_logprobs: _containers.RepeatedCompositeFieldContainer[Alternative]
    sample: int
    def __init__(self, id: _Optional[int] = ..., text: _Optional[str] = ..., index: _Optional[int] = ..., latency_ms: _Optional[float] = ..., logprob: _Optional[float] = ..., top_logprobs: _Optional[_Iterable[_Union[Alternative, _Mapping]]] = ..., sample: _Optional[int] = ...) -> None: ...

class Alternative(_message.Message):
    __slots__ = ("id", "text", "logprob")
    ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    id: int
    text: str
    logprob: float
    def __init__(self, id: _Optional[int] = ..., text: _Optional[str] = ..., logprob: _Optional[float] = ...) -> None: ...

class TokenLogprobs(_message.Message):
    __slots__ = ("id", "logprob", "top")
    ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    id: int
    logprob: float
    top: _containers.RepeatedCompositeFieldContainer[Alternative]
    def __init__(self, id: _Optional[int] = ..., logprob: _Optional[float] = ..., top: _Optional[_Iterable[_Union[Alternative, _Mapping]]] = ...) -> None: ...

class Sample(_message.Message):
    __slots__ = ("index", "text", "token_ids", "finish_reason", "logprobs", "tool_calls", "content")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    index: int
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: FinishReason
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprobs]
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    content: str
    def __init__(self, index: _Optional[int] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprobs, _Mapping]]] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., content: _Optional[str] = ...) -> None: ...

class Completion(_message.Message):
    __slots__ = ("text", "token_ids", "finish_reason", "usage", "timing", "prefill", "request_id", "session_id", "session_length", "logprobs", "prompt_logprobs", "samples", "tool_calls", "content")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_LENGTH_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: FinishReason
    usage: Usage
    timing: Timing
    prefill: PrefillSummary
    request_id: str
    session_id: str
    session_length: int
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprobs]
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprobs]
    samples: _containers.RepeatedCompositeFieldContainer[Sample]
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    content: str
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ..., prefill: _Optional[_Union[PrefillSummary, _Mapping]] = ..., request_id: _Optional[str] = ..., session_id: _Optional[str] = ..., session_length: _Optional[int] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprobs, _Mapping]]] = ..., prompt_logprobs: _Optional[_Iterable[_Union[TokenLogprobs, _Mapping]]] = ..., samples: _Optional[_Iterable[_Union[Sample, _Mapping]]] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., content: _Optional[str] = ...) -> None: ...

class TokenEvent(_message.Message):
    __slots__ = ("token", "done", "tokens")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    token: Token
    done: Completion
    tokens: Tokens
    def __init__(self, token: _Optional[_Union[Token, _Mapping]] = ..., done: _Optional[_Union[Completion, _Mapping]] = ..., tokens: _Optional[_Union[Tokens, _Mapping]] = ...) -> None: ...

class Tokens(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedCompositeFieldContainer[Token]
    def __init__(self, tokens: _Optional[_Iterable[_Union[Token, _Mapping]]] = ...) -> None: ...

class PrefillRequest(_message.Message):
    __slots__ = ("session_id", "prompt", "sampling", "last")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    prompt: Prompt
    sampling: SamplingOptions
    last: bool
    def __init__(self, session_id: _Optional[str] = ..., prompt: _Optional[_Union[Prompt, _Mapping]] = ..., sampling: _Optional[_Union[SamplingOptions, _Mapping]] = ..., last: _Optional[bool] = ...) -> None: ...

class ForwardEvent(_message.Message):
    __slots__ = ("session_id", "real_rows", "width", "past", "length")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REAL_ROWS_FIELD_NUMBER: _ClassVar[int]
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    PAST_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    real_rows: int
    width: int
    past: int
    length: int
    def __init__(self, session_id: _Optional[str] = ..., real_rows: _Optional[int] = ..., width: _Optional[int] = ..., past: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class PrefillDone(_message.Message):
    __slots__ = ("session_id", "length", "next_token", "next_token_text", "summary", "timing")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    NEXT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    NEXT_TOKEN_TEXT_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    length: int
    next_token: int
    next_token_text: str
    summary: PrefillSummary
    timing: Timing
    def __init__(self, session_id: _Optional[str] = ..., length: _Optional[int] = ..., next_token: _Optional[int] = ..., next_token_text: _Optional[str] = ..., summary: _Optional[_Union[PrefillSummary, _Mapping]] = ..., timing: _Optional[_Union[Timing, _Mapping]] = ...) -> None: ...

class PrefillEvent(_message.Message):
    __slots__ = ("forward", "done")
    FORWARD_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    forward: ForwardEvent
    done: PrefillDone
    def __init__(self, forward: _Optional[_Union[ForwardEvent, _Mapping]] = ..., done: _Optional[_Union[PrefillDone, _Mapping]] = ...) -> None: ...

class DecodeRequest(_message.Message):
    __slots__ = ("session_id", "sampling", "stopping", "logprobs", "constraint", "coalesce_tokens", "speculate")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    STOPPING_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    COALESCE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SPECULATE_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    sampling: SamplingOptions
    stopping: StoppingOptions
    logprobs: LogprobOptions
    constraint: Constraint
    coalesce_tokens: bool
    speculate: bool
    def __init__(self, session_id: _Optional[str] = ..., sampling: _Optional[_Union[SamplingOptions, _Mapping]] = ..., stopping: _Optional[_Union[StoppingOptions, _Mapping]] = ..., logprobs: _Optional[_Union[LogprobOptions, _Mapping]] = ..., constraint: _Optional[_Union[Constraint, _Mapping]] = ..., coalesce_tokens: _Optional[bool] = ..., speculate: _Optional[bool] = ...) -> None: ...

class RewindRequest(_message.Message):
    __slots__ = ("session_id", "length")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    length: int
    def __init__(self, session_id: _Optional[str] = ..., length: _Optional[int] = ...) -> None: ...

class RewindResponse(_message.Message):
    __slots__ = ("session_id", "length")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    length: int
    def __init__(self, session_id: _Optional[str] = ..., length: _Optional[int] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ("session_id", "length")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    length: int
    def __init__(self, session_id: _Optional[str] = ..., length: _Optional[int] = ...) -> None: ...

class TokenizeRequest(_message.Message):
    __slots__ = ("text", "chat")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    text: str
    chat: Chat
    def __init__(self, text: _Optional[str] = ..., chat: _Optional[_Union[Chat, _Mapping]] = ...) -> None: ...

class TokenizeResponse(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class DetokenizeRequest(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class DetokenizeResponse(_message.Message):
    __slots__ = ("text",)
    TEXT_FIELD_NUMBER: _ClassVar[int]
    text: str
    def __init__(self, text: _Optional[str] = ...) -> None: ...

class GetModelInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("model", "vocab_size", "capacity", "chunk_size", "ladder", "execution_provider", "padding_enabled", "recurrent_state", "eos_token_ids", "bos_token_id", "num_layers", "has_tokenizer", "max_sessions", "variant_capacity", "max_new_tokens_limit", "max_prompt_tokens", "pod_name", "batch_widths", "default_max_new_tokens")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SIZE_FIELD_NUMBER: _ClassVar[int]
    LADDER_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_PROVIDER_FIELD_NUMBER: _ClassVar[int]
    PADDING_ENABLED_FIELD_NUMBER: _ClassVar[int]
    RECURRENT_STATE_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    BOS_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    HAS_TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    VARIANT_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_LIMIT_FIELD_NUMBER: _ClassVar[int]
    MAX_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    POD_NAME_FIELD_NUMBER: _ClassVar[int]
    BATCH_WIDTHS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    model: str
    vocab_size: int
    capacity: int
    chunk_size: int
    ladder: _containers.RepeatedScalarFieldContainer[int]
    execution_provider: str
    padding_enabled: bool
    recurrent_state: bool
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    bos_token_id: int
    num_layers: int
    has_tokenizer: bool
    max_sessions: int
    variant_capacity: int
    max_new_tokens_limit: int
    max_prompt_tokens: int
    pod_name: str
    batch_widths: _containers.RepeatedScalarFieldContainer[int]
    default_max_new_tokens: int
    def __init__(self, model: _Optional[str] = ..., vocab_size: _Optional[int] = ..., capacity: _Optional[int] = ..., chunk_size: _Optional[int] = ..., ladder: _Optional[_Iterable[int]] = ..., execution_provider: _Optional[str] = ..., padding_enabled: _Optional[bool] = ..., recurrent_state: _Optional[bool] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., bos_token_id: _Optional[int] = ..., num_layers: _Optional[int] = ..., has_tokenizer: _Optional[bool] = ..., max_sessions: _Optional[int] = ..., variant_capacity: _Optional[int] = ..., max_new_tokens_limit: _Optional[int] = ..., max_prompt_tokens: _Optional[int] = ..., pod_name: _Optional[str] = ..., batch_widths: _Optional[_Iterable[int]] = ..., default_max_new_tokens: _Optional[int] = ...) -> None: ...

class GetEngineStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class VariantStats(_message.Message):
    __slots__ = ("entries", "capacity", "hits", "misses", "prepared", "evictions", "refusals", "bytes", "held")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    MISSES_FIELD_NUMBER: _ClassVar[int]
    PREPARED_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    REFUSALS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    entries: int
    capacity: int
    hits: int
    misses: int
    prepared: int
    evictions: int
    refusals: int
    bytes: int
    held: _containers.RepeatedCompositeFieldContainer[VariantEntry]
    def __init__(self, entries: _Optional[int] = ..., capacity: _Optional[int] = ..., hits: _Optional[int] = ..., misses: _Optional[int] = ..., prepared: _Optional[int] = ..., evictions: _Optional[int] = ..., refusals: _Optional[int] = ..., bytes: _Optional[int] = ..., held: _Optional[_Iterable[_Union[VariantEntry, _Mapping]]] = ...) -> None: ...

class VariantEntry(_message.Message):
    __slots__ = ("width", "ports", "bytes", "hits", "batch")
    WIDTH_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    width: int
    ports: _containers.RepeatedScalarFieldContainer[str]
    bytes: int
    hits: int
    batch: int
    def __init__(self, width: _Optional[int] = ..., ports: _Optional[_Iterable[str]] = ..., bytes: _Optional[int] = ..., hits: _Optional[int] = ..., batch: _Optional[int] = ...) -> None: ...

class MemoryUse(_message.Message):
    __slots__ = ("weights_bytes", "kv_bytes", "variant_bytes", "total_bytes", "budget_bytes")
    WEIGHTS_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_FIELD_NUMBER: _ClassVar[int]
    VARIANT_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    weights_bytes: int
    kv_bytes: int
    variant_bytes: int
    total_bytes: int
    budget_bytes: int
    def __init__(self, weights_bytes: _Optional[int] = ..., kv_bytes: _Optional[int] = ..., variant_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ..., budget_bytes: _Optional[int] = ...) -> None: ...

class EngineStats(_message.Message):
    __slots__ = ("variants", "eager_forwards", "sessions_open", "sessions_padding_off", "slots_allocated", "slot_bytes", "queue_depth", "prompt_tokens", "generated_tokens", "padded_rows", "memory", "decode", "waiting_for_slot", "prefix", "parking", "prompt_batches", "exactness")
    VARIANTS_FIELD_NUMBER: _ClassVar[int]
    EAGER_FORWARDS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_OPEN_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_PADDING_OFF_FIELD_NUMBER: _ClassVar[int]
    SLOTS_ALLOCATED_FIELD_NUMBER: _ClassVar[int]
    SLOT_BYTES_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PADDED_ROWS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    DECODE_FIELD_NUMBER: _ClassVar[int]
    WAITING_FOR_SLOT_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    PARKING_FIELD_NUMBER: _ClassVar[int]
    PROMPT_BATCHES_FIELD_NUMBER: _ClassVar[int]
    EXACTNESS_FIELD_NUMBER: _ClassVar[int]
    variants: VariantStats
    eager_forwards: int
    sessions_open: int
    sessions_padding_off: int
    slots_allocated: int
    slot_bytes: int
    queue_depth: int
    prompt_tokens: int
    generated_tokens: int
    padded_rows: int
    memory: MemoryUse
    decode: DecodeStats
    waiting_for_slot: int
    prefix: PrefixStats
    parking: ParkingStats
    prompt_batches: PromptBatchStats
    exactness: ExactnessRules
    def __init__(self, variants: _Optional[_Union[VariantStats, _Mapping]] = ..., eager_forwards: _Optional[int] = ..., sessions_open: _Optional[int] = ..., sessions_padding_off: _Optional[int] = ..., slots_allocated: _Optional[int] = ..., slot_bytes: _Optional[int] = ..., queue_depth: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., padded_rows: _Optional[int] = ..., memory: _Optional[_Union[MemoryUse, _Mapping]] = ..., decode: _Optional[_Union[DecodeStats, _Mapping]] = ..., waiting_for_slot: _Optional[int] = ..., prefix: _Optional[_Union[PrefixStats, _Mapping]] = ..., parking: _Optional[_Union[ParkingStats, _Mapping]] = ..., prompt_batches: _Optional[_Union[PromptBatchStats, _Mapping]] = ..., exactness: _Optional[_Union[ExactnessRules, _Mapping]] = ...) -> None: ...

class ExactnessRules(_message.Message):
    __slots__ = ("restore_rule", "least_decode_batch", "measured", "one_row_gap", "re_run_gap", "verify_gap")
    RESTORE_RULE_FIELD_NUMBER: _ClassVar[int]
    LEAST_DECODE_BATCH_FIELD_NUMBER: _ClassVar[int]
    MEASURED_FIELD_NUMBER: _ClassVar[int]
    ONE_ROW_GAP_FIELD_NUMBER: _ClassVar[int]
    RE_RUN_GAP_FIELD_NUMBER: _ClassVar[int]
    VERIFY_GAP_FIELD_NUMBER: _ClassVar[int]
    restore_rule: str
    least_decode_batch: int
    measured: bool
    one_row_gap: float
    re_run_gap: float
    verify_gap: float
    def __init__(self, restore_rule: _Optional[str] = ..., least_decode_batch: _Optional[int] = ..., measured: _Optional[bool] = ..., one_row_gap: _Optional[float] = ..., re_run_gap: _Optional[float] = ..., verify_gap: _Optional[float] = ...) -> None: ...

class PromptBatchStats(_message.Message):
    __slots__ = ("max_prompts", "forwards", "prompts")
    MAX_PROMPTS_FIELD_NUMBER: _ClassVar[int]
    FORWARDS_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    max_prompts: int
    forwards: int
    prompts: int
    def __init__(self, max_prompts: _Optional[int] = ..., forwards: _Optional[int] = ..., prompts: _Optional[int] = ...) -> None: ...

class ParkingStats(_message.Message):
    __slots__ = ("enabled", "sessions_parked", "parked_bytes", "parks", "unparks", "park_seconds", "unpark_seconds", "released_bytes", "device_bytes", "spills")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_PARKED_FIELD_NUMBER: _ClassVar[int]
    PARKED_BYTES_FIELD_NUMBER: _ClassVar[int]
    PARKS_FIELD_NUMBER: _ClassVar[int]
    UNPARKS_FIELD_NUMBER: _ClassVar[int]
    PARK_SECONDS_FIELD_NUMBER: _ClassVar[int]
    UNPARK_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RELEASED_BYTES_FIELD_NUMBER: _ClassVar[int]
    DEVICE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SPILLS_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    sessions_parked: int
    parked_bytes: int
    parks: int
    unparks: int
    park_seconds: float
    unpark_seconds: float
    released_bytes: int
    device_bytes: int
    spills: int
    def __init__(self, enabled: _Optional[bool] = ..., sessions_parked: _Optional[int] = ..., parked_bytes: _Optional[int] = ..., parks: _Optional[int] = ..., unparks: _Optional[int] = ..., park_seconds: _Optional[float] = ..., unpark_seconds: _Optional[float] = ..., released_bytes: _Optional[int] = ..., device_bytes: _Optional[int] = ..., spills: _Optional[int] = ...) -> None: ...

class DecodeStats(_message.Message):
    __slots__ = ("steps", "rows", "ride_along_rows", "widths", "batch_widths", "unbatched_reason", "lookahead_hits", "lookahead_misses", "chained_steps", "rows_moved", "verify_forwards", "drafted_tokens", "accepted_tokens")
    STEPS_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    RIDE_ALONG_ROWS_FIELD_NUMBER: _ClassVar[int]
    WIDTHS_FIELD_NUMBER: _ClassVar[int]
    BATCH_WIDTHS_FIELD_NUMBER: _ClassVar[int]
    UNBATCHED_REASON_FIELD_NUMBER: _ClassVar[int]
    LOOKAHEAD_HITS_FIELD_NUMBER: _ClassVar[int]
    LOOKAHEAD_MISSES_FIELD_NUMBER: _ClassVar[int]
    CHAINED_STEPS_FIELD_NUMBER: _ClassVar[int]
    ROWS_MOVED_FIELD_NUMBER: _ClassVar[int]
    VERIFY_FORWARDS_FIELD_NUMBER: _ClassVar[int]
    DRAFTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    steps: int
    rows: int
    ride_along_rows: int
    widths: _containers.RepeatedCompositeFieldContainer[BatchWidthUse]
    batch_widths: _containers.RepeatedScalarFieldContainer[int]
    unbatched_reason: str
    lookahead_hits: int
    lookahead_misses: int
    chained_steps: int
    rows_moved: int
    verify_forwards: int
    drafted_tokens: int
    accepted_tokens: int
    def __init__(self, steps: _Optional[int] = ..., rows: _Optional[int] = ..., ride_along_rows: _Optional[int] = ..., widths: _Optional[_Iterable[_Union[BatchWidthUse, _Mapping]]] = ..., batch_widths: _Optional[_Iterable[int]] = ..., unbatched_reason: _Optional[str] = ..., lookahead_hits: _Optional[int] = ..., lookahead_misses: _Optional[int] = ..., chained_steps: _Optional[int] = ..., rows_moved: _Optional[int] = ..., verify_forwards: _Optional[int] = ..., drafted_tokens: _Optional[int] = ..., accepted_tokens: _Optional[int] = ...) -> None: ...

class BatchWidthUse(_message.Message):
    __slots__ = ("batch", "forwards")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    FORWARDS_FIELD_NUMBER: _ClassVar[int]
    batch: int
    forwards: int
    def __init__(self, batch: _Optional[int] = ..., forwards: _Optional[int] = ...) -> None: ...

class ForkSessionRequest(_message.Message):
    __slots__ = ("session_id", "length", "fork_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    FORK_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    length: int
    fork_id: str
    def __init__(self, session_id: _Optional[str] = ..., length: _Optional[int] = ..., fork_id: _Optional[str] = ...) -> None: ...

class ForkSessionResponse(_message.Message):
    __slots__ = ("session_id", "length", "source_session_id", "server_ms")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    SOURCE_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SERVER_MS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    length: int
    source_session_id: str
    server_ms: float
    def __init__(self, session_id: _Optional[str] = ..., length: _Optional[int] = ..., source_session_id: _Optional[str] = ..., server_ms: _Optional[float] = ...) -> None: ...

class PrefixStats(_message.Message):
    __slots__ = ("enabled", "lookups", "hits", "tokens_saved", "forks", "slots_held", "bytes_held", "evictions")
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    LOOKUPS_FIELD_NUMBER: _ClassVar[int]
    HITS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_SAVED_FIELD_NUMBER: _ClassVar[int]
    FORKS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_HELD_FIELD_NUMBER: _ClassVar[int]
    BYTES_HELD_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    enabled: bool
    lookups: int
    hits: int
    tokens_saved: int
    forks: int
    slots_held: int
    bytes_held: int
    evictions: int
    def __init__(self, enabled: _Optional[bool] = ..., lookups: _Optional[int] = ..., hits: _Optional[int] = ..., tokens_saved: _Optional[int] = ..., forks: _Optional[int] = ..., slots_held: _Optional[int] = ..., bytes_held: _Optional[int] = ..., evictions: _Optional[int] = ...) -> None: ...
