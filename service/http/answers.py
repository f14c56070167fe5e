"""Answers in OpenAI's shapes: a choice per sample of each prompt, the usage, streamed chunks.

A call's results (each prompt's Progress, or its worker events as they come) are written here as
chat completions or completions objects, their chunks, and tool calls read from a reply (chat with
tools: service/front/tool_calls.py). Nothing here touches the network.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.sampling import TokenLogprobs
from service.events import Finish, Finished, PromptLogprobs, TokenOut
from service.front.progress import Progress, SampleRecord
from service.front.tool_calls import ToolStream, call_id
from service.http import tools as http_tools
from service.http.completions import Echo, Offsets, TokenText, entries_of, legacy_logprobs, prompt_entries
from service.http.openai import OpenAICall

Json = dict[str, Any]


FINISH = {Finish.LENGTH: "length", Finish.CAPACITY: "length", Finish.EOS: "stop", Finish.STOP: "stop"}


def usage(progresses: Sequence[Progress]) -> Json:
    """Tokens over every prompt of the call and every sample of each."""
    prompt = sum(p.prompt_tokens for p in progresses)
    completion = sum(p.generated for p in progresses)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _alternative(token: int, logprob: float, tokens: TokenText) -> Json:
    """OpenAI's token entry: `bytes` are the token's own bytes (a piece of a multi-byte character
    included, whose text alone is U+FFFD), so a reply's tokens' bytes join to its text's."""
    return {"token": tokens.token_text(token), "logprob": logprob, "bytes": list(tokens.token_bytes(token))}


def chat_logprobs(found: list[TokenLogprobs], tokens: TokenText) -> Json:
    return {
        "content": [
            {
                **_alternative(t.token, t.logprob, tokens),
                "top_logprobs": [_alternative(i, v, tokens) for i, v in t.top],
            }
            for t in found
        ],
        "refusal": None,
    }  # OpenAI's schema requires it (the model never refuses by a field here)


@dataclass(frozen=True)
class Answer:
    """How one call's answer is written: its id, creation time and model, chat or not, and each
    prompt as echoed (completions with echo)."""

    call: OpenAICall
    request_id: str
    created: int
    tokens: TokenText
    echoes: tuple[Echo, ...] = ()

    @property
    def id(self) -> str:
        return ("chatcmpl-" if self.call.chat else "cmpl-") + self.request_id

    def _head(self, chunk: bool) -> Json:
        kind = "chat.completion" if self.call.chat else "text_completion"
        return {
            "id": self.id,
            "object": kind + (".chunk" if chunk and self.call.chat else ""),
            "created": self.created,
            "model": self.call.model,
        }

    def echoed(self, prompt: int) -> str:
        """The text a choice of prompt `prompt` starts with: the prompt's with echo, else none."""
        return self.echoes[prompt].text if self.call.echo else ""

    def whole(self, progresses: Sequence[Progress]) -> Json:
        """The non-streaming answer: every sample of every prompt as a choice (indexed prompt * n +
        sample, as OpenAI's), and the usage of them all."""
        n = self.call.n
        choices = [
            self._choice(p * n + i, record, p, progress.prompt_logprobs)
            for p, progress in enumerate(progresses)
            for i, record in enumerate(progress.sample_records())
        ]
        return {**self._head(False), "choices": choices, "usage": usage(progresses)}

    def _choice(
        self, index: int, record: SampleRecord, prompt: int, prompt_found: Sequence[TokenLogprobs]
    ) -> Json:
        reason = FINISH[record.finished.reason] if record.finished is not None else None
        choice: Json = {"index": index, "finish_reason": reason, "logprobs": None}
        if self.call.chat:
            if self.call.generate.logprobs is not None:
                choice["logprobs"] = chat_logprobs(record.logprobs, self.tokens)
            choice["message"] = {"role": "assistant", "content": record.text, "refusal": None}
            parsed = self.call.tools.read(record.text) if self.call.tools is not None else None
            if parsed is not None and parsed.calls:
                choice["message"] = http_tools.message_of(parsed, [call_id() for _ in parsed.calls])
                choice["finish_reason"] = "tool_calls" if reason == "stop" else reason
            return choice
        echoed = self.echoed(prompt)
        choice["text"] = echoed + record.text
        if self.call.generate.logprobs is not None:
            entries, offsets = [], []
            if self.call.echo:
                echo = self.echoes[prompt]
                entries = prompt_entries(echo, prompt_found)
                offsets = Offsets(self.tokens, 0, len(echo.text)).all(echo.ids)
            entries += entries_of(record.logprobs)
            offsets += Offsets(self.tokens, len(echoed), len(choice["text"])).all(
                [t.token for t in record.logprobs]
            )
            choice["logprobs"] = legacy_logprobs(entries, offsets, self.tokens)
        return choice

    def delta_chunk(
        self,
        index: int,
        delta: Json,
        found: list[TokenLogprobs] | None = None,
        finish_reason: str | None = None,
    ) -> Json:
        """A chat chunk of choice `index` carrying `delta` (content or a tool call's part)."""
        choice: Json = {
            "index": index,
            "logprobs": chat_logprobs(found, self.tokens) if found else None,
            "finish_reason": finish_reason,
            "delta": delta,
        }
        return {**self._head(True), "choices": [choice]}

    def chunk(
        self,
        index: int,
        text: str,
        *,
        logprobs: Json | None = None,
        finish: Finish | None = None,
        role: bool = False,
    ) -> Json:
        """One streamed chunk of choice `index`: its next text (a role first, on chat), or its finish
        (the chunk of its last text, or one with none, and no chunk after it)."""
        choice: Json = {
            "index": index,
            "logprobs": logprobs,
            "finish_reason": FINISH[finish] if finish is not None else None,
        }
        if self.call.chat:
            choice["delta"] = (
                {"role": "assistant", "content": text}
                if role
                else ({} if finish is not None and not text else {"content": text})
            )
        else:
            choice["text"] = text
        return {**self._head(True), "choices": [choice]}

    def usage_chunk(self, progresses: Sequence[Progress]) -> Json:
        return {**self._head(True), "choices": [], "usage": usage(progresses)}


class Chunks:
    """The streamed chunks of one call, event by event: each sample's text, logprobs, finish. Events
    come tagged with their prompt: a choice is prompt * n + sample."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.offsets: dict[int, Offsets] = {}  # per choice: completions' text_offset
        tools = answer.call.tools
        self.tools = ToolChunks(answer) if tools is not None and tools.active else None

    def opening(self) -> list[Json]:
        """Chat: every choice's role, before any text; completions with echo (and no logprobs, whose
        prompt part comes with the prompt's log-probabilities): every choice's prompt."""
        call = self.answer.call
        if call.chat:
            return [self.answer.chunk(i, "", role=True) for i in range(call.n)]
        if call.echo and call.generate.logprobs is None:
            return [chunk for p in range(len(call.generates)) for chunk in self._echo(p, ())]
        return []

    def of(self, event: Any, prompt: int = 0) -> list[Json]:
        if self.tools is not None:
            return self.tools.of(event)
        answer, n = self.answer, self.answer.call.n
        if isinstance(event, PromptLogprobs) and answer.call.echo:
            return self._echo(prompt, event.logprobs)
        if isinstance(event, TokenOut):
            index = prompt * n + event.sample
            logprobs = None
            if event.logprobs is not None:
                offset = self._offsets(index, prompt).of(event.id)
                logprobs = self._logprobs([event.logprobs], [offset])
            return [answer.chunk(index, event.text, logprobs=logprobs)]
        if isinstance(event, Finished):
            return [answer.chunk(prompt * n + event.sample, event.tail, finish=event.reason)]
        return []

    def _logprobs(self, found: list[TokenLogprobs], offsets: list[int]) -> Json:
        if self.answer.call.chat:
            return chat_logprobs(found, self.answer.tokens)
        return legacy_logprobs(entries_of(found), offsets, self.answer.tokens)

    def _offsets(self, index: int, prompt: int) -> Offsets:
        found = self.offsets.get(index)
        if found is None:
            found = self.offsets[index] = Offsets(self.answer.tokens, len(self.answer.echoed(prompt)))
        return found

    def _echo(self, prompt: int, found: Sequence[TokenLogprobs]) -> list[Json]:
        """Each choice of `prompt`'s first chunk: the prompt's text (and its tokens' log-probabilities)."""
        answer, n = self.answer, self.answer.call.n
        echo = answer.echoes[prompt]
        logprobs = None
        if answer.call.generate.logprobs is not None:
            offsets = Offsets(answer.tokens, 0, len(echo.text)).all(echo.ids)
            logprobs = legacy_logprobs(prompt_entries(echo, found), offsets, answer.tokens)
        return [answer.chunk(prompt * n + i, echo.text, logprobs=logprobs) for i in range(n)]


class ToolChunks:
    """The streamed chunks of a chat call read for tool calls: each sample's reply through a ToolStream
    (service/front/tool_calls.py), as content and `delta.tool_calls` chunks the SDKs accumulate. The
    log-probabilities of text held back go out with the next chunk of that sample."""

    def __init__(self, answer: Answer) -> None:
        assert answer.call.tools is not None
        self.answer = answer
        self.request = answer.call.tools
        self.streams: dict[int, ToolStream] = {}
        self.pending: dict[int, list[TokenLogprobs]] = {}

    def of(self, event: Any) -> list[Json]:
        if isinstance(event, TokenOut):
            if event.logprobs is not None:
                self.pending.setdefault(event.sample, []).append(event.logprobs)
            return self._chunks(event.sample, self._stream(event.sample).feed(event.text))
        if isinstance(event, Finished):
            stream = self._stream(event.sample)
            chunks = self._chunks(event.sample, stream.feed(event.tail) + stream.finish())
            reason = FINISH[event.reason]
            if stream.calls and reason == "stop":
                reason = "tool_calls"
            found = self.pending.pop(event.sample, None)
            chunks.append(self.answer.delta_chunk(event.sample, {}, found, reason))
            return chunks
        return []

    def _stream(self, sample: int) -> ToolStream:
        return self.streams.setdefault(sample, ToolStream(self.request))

    def _chunks(self, sample: int, deltas: list[Any]) -> list[Json]:
        chunks = []
        for delta in deltas:
            found = self.pending.pop(sample, None)
            chunks.append(self.answer.delta_chunk(sample, http_tools.delta_of(delta), found))
        return chunks
