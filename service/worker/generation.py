"""The job bodies the engine worker runs for the calls: generators that yield events for the
caller (service/events.py) and requests for the scheduler (a slot, a prefill chunk, a decode row,
service/worker/rounds.py). They never see protobuf, never touch tensors and never call the engine
themselves. The model they serve: service/served_model.py.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import structlog

from engine.errors import OverCapacity
from engine.executor import DecodeRow, Session
from engine.executor.step import Choose, Close, Fork, Open, Prefill, Rewind
from engine.sampling import Sampler, TokenLogprobs
from service.calls import Stopping
from service.core.sessions import SessionState
from service.events import (
    Finish,
    Finished,
    ForwardDone,
    PrefillFinished,
    PromptLogprobs,
    Shared,
    Started,
    TokenOut,
)
from service.served_model import ServedModel
from service.worker.cuts import Cuts
from service.worker.jobs import Body, Result
from service.worker.min_tokens import released, structured
from service.worker.rounds import Asked, Draft, Feed, Lend, Timed, Token, Verdict, ask
from service.worker.samples import first_sampler_order, firsts_by_sample, samples_body
from service.worker.speculation import Speculation

log = structlog.get_logger("ladder.sessions")


# -- worker-side bodies: they ask the scheduler for engine work and never call the engine themselves --


def prefill_steps(
    session: Session,
    tokens: Sequence[int],
    share: bool = True,
    logprob_top: int | None = None,
    copies: Sequence[Session] = (),
    samplers: Sequence[Sampler] = (),
    batchable: bool = False,
) -> Asked[tuple[int, ...]]:
    """Append the prompt, one forward per round; the session's next-token logits follow it. An empty
    session first takes the longest prefix of the prompt held for its caller (`share`). With
    `logprob_top`, the prompt's log-probabilities follow the last forward (PromptLogprobs): the
    caller then shares nothing, as a shared prefix has no logits rows to score. After the last
    forward the session is copied into `copies`; with `samplers` the first tokens (the session's,
    then each copy's) are chosen in the round's batched choice and returned. `batchable`: the
    first chunk may share a forward with other new prompts (a session that ends with the call)."""
    request = Prefill(
        session, tuple(tokens), share, logprob_top, tuple(copies), tuple(samplers), batchable=batchable
    )
    while True:
        progress = yield from ask(request)
        if progress.shared:
            yield Shared(progress.shared)
        report = progress.report
        if report is not None:
            forward = report.forward
            yield ForwardDone(forward.rows, report.width, forward.past, report.length)
        if progress.done:
            break
        request = replace(request, task=progress.task, tokens=())
    if logprob_top is not None:
        yield PromptLogprobs(tuple(progress.task.logprobs))
    return progress.tokens


def decode_steps(
    model: ServedModel,
    session: Session,
    sampler: Sampler,
    stopping: Stopping,
    feed_last: bool,
    sample: int = 0,
    first: int | None = None,
    drafts: int = 0,
    cuts: Cuts | None = None,
) -> Body:
    """Emit and feed tokens from the session's next-token logits.

    The first token is `first` (chosen with the prefill's last forward) or chosen from the logits
    the session holds, every later one by the round's decode forward, all by the engine. With
    `feed_last` the session keeps every emitted token (so the next Decode continues after it); a
    session left mid-way holds the tokens fed so far and their logits, so it stays usable.

    Tokens go out as ids: their text and the stop strings are the call's (service/front/texts.py). A
    stop string it finds is a cut in `cuts` (given when the call looks for stop strings), seen at
    the next step: the sample ends there. A kept session feeds no token before the call judged the
    one before it (`Verdict`), and ends holding the tokens up to the cut, as if the stop string had
    been matched here.

    With `drafts` (speculative decoding, `Speculation`), a step may come back with several tokens,
    every one but the last already fed: they are emitted one by one as if each had its own step,
    and a stop among them rewinds a kept session to the tokens emitted.
    """
    judge = cuts if feed_last else None  # a kept session waits for the call's verdicts
    start = session.length  # where the first emitted token goes
    reason = Finish.LENGTH
    token = first if first is not None else (yield from ask(Choose(session, sampler)))
    last = sampler.last
    ahead: list[tuple[int, TokenLogprobs | None]] = []  # chosen, not emitted; `token` fed when any
    speculation = (
        Speculation(
            [*session.tokens, token],
            sampler,
            stopping,
            drafts,
            model.eos_ids,
            model.forward_costs,
            model.lone,
        )
        if drafts
        else None
    )
    emitted = -1
    for index in range(stopping.max_new_tokens):
        if cuts is not None and sample in cuts.cut:
            break  # the call found a stop string at an earlier token
        if index + 1 >= stopping.min_new_tokens:  # this token makes min_tokens: it may end the sample
            released(sampler)  # and so may the next choice
        yield TokenOut(token, "", index, time.perf_counter(), last, sample)
        emitted = index
        held = session.length - len(ahead)  # what the session would hold without speculation
        stopped = _stop_reason(model, stopping, token, sampler, chosen_past=bool(ahead))
        if stopped is not None or held + 1 > model.capacity:
            reason = stopped or Finish.CAPACITY
            break
        if index + 1 >= stopping.max_new_tokens:
            continue
        if ahead:
            token, last = ahead.pop(0)
            continue
        if judge is not None:  # the next forward feeds `token`: the one before it must stand
            yield from _verdict(judge, sample, index - 1)
            if sample in judge.cut:
                break
        # The token chosen here is fed next only if another follows it or the session keeps it.
        more = (index + 2 < stopping.max_new_tokens or feed_last) and held + 2 <= model.capacity
        row = DecodeRow(session, token, sampler, more)
        room = stopping.max_new_tokens - index - 2  # tokens after the next that the budget still emits
        draft = speculation.draft(room, emitted=index + 1) if speculation is not None else ()
        if speculation is not None and draft:
            verified = yield from ask(Draft(replace(row, drafts=draft, stops=speculation.stops)))
            speculation.verified(verified)
            ahead = list(zip(verified.tokens, verified.logprobs, strict=True))
            token, last = ahead.pop(0)
        else:
            token = yield from ask(Token(row))
            last = sampler.last
            if speculation is not None:
                speculation.chose(token)
    if judge is not None:
        yield from _verdict(judge, sample, emitted)
    cut = cuts.cut.get(sample) if cuts is not None else None
    if cut is not None:
        if feed_last:  # hold the tokens up to the cut: the one that completed the stop string fed
            kept = start + cut + 1 if start + cut + 1 <= model.capacity else start + cut
            if session.length > kept:
                yield from ask(Rewind(session, kept))
            elif session.length < kept:  # `token` completed it and is not fed yet
                yield from ask(Feed(DecodeRow(session, token)))
        yield Finished(Finish.STOP, "", session.length, sample)
        return
    if ahead and feed_last:  # the last token emitted is fed; so are chosen ones past it but the last
        if len(ahead) > 1:
            yield from ask(Rewind(session, session.length - len(ahead) + 1))
    elif feed_last and session.length + 1 <= model.capacity:
        yield from ask(Feed(DecodeRow(session, token)))  # fed, not chosen from: the next Decode chooses
    yield Finished(reason, "", session.length, sample)


def _verdict(cuts: Cuts, sample: int, index: int) -> Body:
    """Wait, when it has not come yet, for the call's verdict on the sample's token `index`."""
    if index >= 0 and not cuts.decided(sample, index):
        yield from ask(Verdict(functools.partial(cuts.judged, sample, index)))


def _stop_reason(
    model: ServedModel,
    stopping: Stopping,
    token: int,
    sampler: Sampler,
    chosen_past: bool = False,
) -> Finish | None:
    """Why the sample ends at `token`, if it does (stop strings are the call's: service/front/texts.py).
    `chosen_past`: tokens after it were chosen already (a verified draft), so the constraint's
    state is theirs: it completes only at the last of them."""
    constraint = structured(sampler)
    if token in model.eos_ids and (constraint is not None or not stopping.ignore_eos):
        return Finish.EOS  # a constraint allows end-of-sequence only where the output is complete
    if token in stopping.stop_token_ids:
        return Finish.STOP
    if constraint is not None and constraint.done and not chosen_past:
        return Finish.STOP  # complete, and nothing but end-of-sequence may follow: no forward for it
    return None


def generate_body(
    model: ServedModel,
    tokens: list[int],
    samplers: Sequence[Sampler],
    stopping: Stopping,
    scope: str = "",
    prompt_logprobs: int | None = None,
    speculate: bool = True,
    width: int = 0,
    cuts: Cuts | None = None,
) -> Body:
    """Generate len(samplers) samples on sessions lent to the job (they return to the pool however
    it ends), holding at most `width` KV slots at once (0: one per sample). The first session
    starts from the longest prefix of the prompt held for `scope` (none when the prompt's
    log-probabilities are asked for) and prefills the rest; every sample's first token is chosen
    with the prefill's last forward; samples that got a slot start from a copy of its KV rows and
    logits, the rest as slots free (service/worker/samples.py), and all decode in the same forwards.
    `cuts`: where the call's stop strings end samples (service/front/texts.py)."""
    n = len(samplers)
    shared = () if prompt_logprobs is not None else tuple(tokens)
    sessions = yield from ask(Lend(Open(shared, scope, min(n, width or n)), fan=n > 1))
    yield Started(time.perf_counter())
    first = sessions[0]
    if first.length:
        yield Shared(first.length)
    firsts = yield from prefill_steps(
        first,
        tokens[first.length :],
        share=False,
        logprob_top=prompt_logprobs,
        copies=sessions[1:],
        samplers=first_sampler_order(samplers, len(sessions)),
        batchable=True,
    )
    if n == 1:
        drafts = model.draft_tokens if speculate else 0
        yield from decode_steps(
            model, first, samplers[0], stopping, feed_last=False, first=firsts[0], drafts=drafts, cuts=cuts
        )
        return
    steps = functools.partial(decode_steps, model, cuts=cuts)  # n > 1 does not draft: the samples batch
    yield from samples_body(
        steps, samplers, firsts_by_sample(firsts, len(sessions), n), sessions, stopping, width or n
    )


def prefill_body(state: SessionState, tokens: list[int]) -> Body:
    """Extend a session by one prompt part."""
    yield from prefill_steps(state.session, tokens)


def decode_body(
    model: ServedModel,
    state: SessionState,
    sampler: Sampler,
    stopping: Stopping,
    speculate: bool = True,
    cuts: Cuts | None = None,
) -> Body:
    """Continue a session; checked on the worker, after any earlier job on it has ended."""
    yield Started(time.perf_counter())
    session = state.session
    if not session.has_logits:
        raise OverCapacity(f"session {state.id} has nothing to continue from (it is empty)")
    if session.length >= model.capacity:  # its last token may not be in it: nothing can follow
        raise OverCapacity(
            f"session {state.id} holds {session.length} tokens, its full KV capacity: rewind it to continue"
        )
    budget = model.budget(stopping, session.length, f"session {state.id}'s")
    sampler.counts.update(state.generated_tokens())  # penalties go on from the earlier Decodes
    start = session.length
    try:
        drafts = model.draft_tokens if speculate else 0
        yield from decode_steps(model, session, sampler, budget, feed_last=True, drafts=drafts, cuts=cuts)
    finally:
        state.generated.extend(range(start, session.length))


def close_body(state: SessionState, reason: str = "") -> Body:
    """Return the session's KV slot; answers the tokens it held (logged with `reason`)."""
    length = yield from ask(Close(state.session))
    if reason:
        log.info("session_closed", session=state.id, reason=reason, length=length)
    yield Result(length)


def peek_body(state: SessionState, sampler: Sampler) -> Body:
    """The token the sampler picks from the session's logits, not fed: the session is left as it is
    (PrefillDone's preview of the next token; its text is the call's)."""
    session = state.session
    token = yield from ask(Choose(session, sampler))
    yield Result(PrefillFinished(session.length, token))


@dataclass(frozen=True)
class Forked:
    session: Session
    ms: float  # time the worker spent


def fork_body(state: SessionState, length: int | None) -> Body:
    """A new engine session holding a copy of the session's first `length` tokens (None: all)."""
    session, seconds = yield from ask(Timed(Fork(state.session, length)))
    yield Result(Forked(session, seconds * 1e3))


def rewind_body(state: SessionState, length: int) -> Body:
    """Keep the first `length` tokens; the engine restores the logits of the tokens kept."""
    yield Result((yield from ask(Rewind(state.session, length))))
