"""/v1/completions' own parts: several prompts in one request, echo, the legacy logprobs layout.

A completions `prompt` may be a batch (one GenerateCall each, run at once: the first failure ends
them all; streamed, their chunks merge as they come); each choice may echo its prompt (with the
prompt's log-probabilities); its logprobs carry each token's text_offset. Chat shares the rest.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from engine.errors import InvalidInput
from engine.sampling import TokenLogprobs
from service.calls import GenerateCall, Prompt
from service.front.front import Front
from service.front.progress import Progress

Json = dict[str, Any]
T = TypeVar("T")


class TokenText(Protocol):
    """A token's own text (special tokens written out), the raw bytes it stands for, and a decoder of
    ids into the text they make (ServedModel's)."""

    def token_text(self, token: int) -> str: ...

    def token_bytes(self, token: int) -> bytes: ...

    def text_decoder(self) -> Any: ...


def _bad(message: str, field: str) -> InvalidInput:
    return InvalidInput(message, reason="INVALID_FIELD", field=field)


# -- prompts ------------------------------------------------------------------------------------------

MAX_PROMPTS = 64  # prompts of one completions request (each its own call; the worker holds 64 by default)


def completion_prompts(value: Any) -> list[Prompt]:
    """The prompts of a completions body: a string, an array of token ids, or an array of either
    (a batch: one call per prompt, choices in the batch's order)."""
    one = _one_prompt(value)
    if one is not None:
        return [one]
    if not isinstance(value, list) or not value:
        raise _bad("prompt takes a string, an array of token ids, or an array of those", "prompt")
    if len(value) > MAX_PROMPTS:
        raise _bad(f"prompt holds {len(value)} prompts; at most {MAX_PROMPTS} are taken at once", "prompt")
    prompts = [_one_prompt(item) for item in value]
    bad = next((i for i, p in enumerate(prompts) if p is None), None)
    if bad is not None:
        raise _bad(f"prompt[{bad}] takes a string or an array of token ids", f"prompt[{bad}]")
    return [p for p in prompts if p is not None]


def _one_prompt(value: Any) -> Prompt | None:
    """A prompt as text or (a non-empty array of) token ids; None for anything else."""
    if isinstance(value, str):
        return Prompt(text=value)
    if isinstance(value, list) and value and all(type(t) is int for t in value):
        return Prompt(ids=tuple(value))
    return None


# -- echo and the legacy logprobs layout --------------------------------------------------------------


@dataclass(frozen=True)
class Echo:
    """A prompt as a completions choice echoes it: its text (as sent, or its token ids' text) and
    its token ids."""

    text: str
    ids: tuple[int, ...]


# One token of the legacy logprobs layout: its id, log-probability and alternatives (None for
# none: the first token of an echoed prompt, which nothing before it predicts).
Entry = tuple[int, float | None, tuple[tuple[int, float], ...] | None]


def entries_of(found: Sequence[TokenLogprobs]) -> list[Entry]:
    return [(t.token, t.logprob, t.top) for t in found]


def prompt_entries(echo: Echo, found: Sequence[TokenLogprobs]) -> list[Entry]:
    """An echoed prompt's tokens: the first with no log-probability (OpenAI's and vLLM's null), then
    the prefill's log-probabilities of the others (PromptLogprobs)."""
    return [(echo.ids[0], None, None), *entries_of(found)]


def legacy_logprobs(entries: Sequence[Entry], offsets: Sequence[int], tokens: TokenText) -> Json:
    """The completions layout: tokens, their log-probabilities, the top alternatives, and where
    each token's text starts in the choice's text (`offsets`)."""
    return {
        "tokens": [tokens.token_text(token) for token, _, _ in entries],
        "token_logprobs": [logprob for _, logprob, _ in entries],
        "top_logprobs": [
            None if top is None else {tokens.token_text(i): v for i, v in top} for _, _, top in entries
        ],
        "text_offset": list(offsets),
    }


class Offsets:
    """Where each token's text starts in a choice's text: the characters its earlier tokens
    decoded to (the streaming decoder's text, a character split over tokens starting where its
    first byte's token does), after `start` (an echoed prompt), never past `end` (a stop string cut
    the text short)."""

    def __init__(self, tokens: TokenText, start: int = 0, end: int | None = None) -> None:
        self.decoder = tokens.text_decoder()
        self.at = start
        self.end = end

    def of(self, token: int) -> int:
        """The offset of `token`, the next one; the decoder moves past it."""
        offset = self.at if self.end is None else min(self.at, self.end)
        if self.decoder is not None:
            self.at += len(self.decoder.push(token))
        return offset

    def all(self, ids: Sequence[int]) -> list[int]:
        return [self.of(token) for token in ids]


async def echoes(front: Front, generates: Sequence[GenerateCall]) -> tuple[Echo, ...]:
    """Each prompt as its choices echo it: text as sent (ids: their text), and its token ids."""
    found = []
    for generate in generates:
        prompt = generate.prompt
        ids = tuple(await front.prompt_ids(prompt))
        text = prompt.text if prompt.text is not None else front.model.detokenize(list(ids), "prompt")
        found.append(Echo(text, ids))
    return tuple(found)


# -- several prompts at once --------------------------------------------------------------------------

Step = tuple[int, tuple[list[Any], Progress]]  # a prompt's index, and a step of its generation


async def first_failure(calls: list[Coroutine[Any, Any, T]]) -> list[T]:
    """Every call's result, run at once; the first failure cancels the others and is raised as it is
    (no ExceptionGroup: it goes through the one error table)."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        failures = [error for task in tasks if task in done and (error := task.exception()) is not None]
        if failures:
            raise failures[0]
        return [task.result() for task in tasks]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def merged(
    generations: list[AsyncGenerator[tuple[list[Any], Progress], None]],
) -> AsyncGenerator[Step, None]:
    """The steps of several generations (one per prompt) as they come, each tagged with its prompt;
    the first failure is raised and ends them all (each is closed: its job cancelled)."""
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    done = object()

    async def run(prompt: int, steps: AsyncGenerator[tuple[list[Any], Progress], None]) -> None:
        try:
            async with aclosing(steps):
                async for step in steps:
                    await queue.put((prompt, step))
        except Exception as exc:  # noqa: BLE001 — handed to the reader, which raises it
            await queue.put((prompt, exc))
        else:
            await queue.put((prompt, done))

    tasks = [asyncio.ensure_future(run(p, g)) for p, g in enumerate(generations)]
    try:
        live = len(tasks)
        while live:
            prompt, item = await queue.get()
            if item is done:
                live -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield prompt, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def until_each_began(steps: AsyncIterator[Step], prompts: int) -> AsyncIterator[Step]:
    """The steps up to the one by which every prompt has had its first (a refusal comes first)."""
    began: set[int] = set()
    while len(began) < prompts:
        step = await anext(steps, None)
        if step is None:
            return
        began.add(step[0])
        yield step


async def chained(first: list[Step], rest: AsyncIterator[Step]) -> AsyncIterator[Step]:
    for step in first:
        yield step
    async for step in rest:
        yield step
