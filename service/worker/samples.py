"""A Generate's n samples on the worker: all at once when their KV slots are free, else started as
slots free (vLLM fans n out alike), so a large n neither waits for n free slots nor blocks a
one-sample request while slots are free, and n may exceed the server's slots.

Every sample's first token is chosen with the prompt's last forward, from the same logits, so a
sample is the same whichever way it starts (sample i draws from seed + i). When fewer slots are
free than samples, the prompt's session (the *holder*) keeps its KV rows and next-token logits
while samples run on copies of it (`Spare`: a fork each, no forward) and runs the last sample
itself. A sample that ends gives its slot back in the next round; the request never holds more
than `width` slots (its share). One job: the running samples' rows ride one decode forward a round.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from engine.executor import DecodeRow, Session
from engine.sampling import Sampler
from service.calls import Stopping
from service.worker.jobs import Body
from service.worker.rounds import Asked, Spare, Token, Tokens, ask

DecodeSteps = Callable[..., Body]  # service.worker.generation.decode_steps, bound to the model


def first_sampler_order(samplers: Sequence[Sampler], sessions: int) -> list[Sampler]:
    """The samplers in the order the prompt's prefill chooses with them: one per session it was
    given (the holder first), then the rest. With every sample's session (`sessions` == n) that
    is sample order; with fewer, the holder runs the last sample, so its sampler comes first."""
    if sessions >= len(samplers):
        return list(samplers)
    return [samplers[-1], *samplers[:-1]]


def firsts_by_sample(firsts: Sequence[int], sessions: int, n: int) -> list[int]:
    """`first_sampler_order`'s tokens back in sample order."""
    return list(firsts) if sessions >= n else [*firsts[1:], firsts[0]]


def samples_body(
    decode_steps: DecodeSteps,
    samplers: Sequence[Sampler],
    firsts: Sequence[int],
    sessions: Sequence[Session],
    stopping: Stopping,
    width: int,
) -> Body:
    """Decode every sample (sample i with `samplers[i]`, from its first token `firsts[i]`).
    `sessions` are the slots the request was lent: one per sample, or fewer, the first then the
    holder of the prompt and the others samples 0, 1, ...; the rest start as slots free."""
    n = len(samplers)
    holder = sessions[0] if len(sessions) < n else None
    running = sessions[1:] if holder is not None else sessions
    live: dict[int, tuple[Body, Session]] = {}

    def start(i: int, session: Session) -> None:
        body = decode_steps(session, samplers[i], stopping, feed_last=False, sample=i, first=firsts[i])
        live[i] = (body, session)

    for i, session in enumerate(running):
        start(i, session)
    started = len(running)
    replies: dict[int, object] = {}
    ended: list[Session] = []  # sessions of samples that ended, given back next round
    try:
        while live or started < n:
            wanted = min(n - 1 - started, width - 1 - len(live)) if holder is not None else 0
            if wanted > 0 or ended:
                forks = yield from ask(Spare(holder, max(wanted, 0), tuple(ended)))
                ended = []
                if not forks and not live and wanted > 0:  # nothing runs: wait for a slot in the queue
                    forks = yield from ask(Spare(holder, wanted, wait=True))
                for session in forks:
                    start(started, session)
                    started += 1
            if holder is not None and started == n - 1:  # every other sample has started
                start(n - 1, holder)
                started, holder = n, None
            rows: dict[int, DecodeRow] = {}
            for i in list(live):
                row = yield from _until_token(live[i][0], replies.pop(i, None))
                if row is None:
                    ended.append(live.pop(i)[1])
                else:
                    rows[i] = row
            if rows:
                tokens = yield from ask(Tokens(tuple(rows.values())))
                replies.update(zip(rows, tokens, strict=True))
    finally:
        for body, _ in live.values():
            body.close()


def _until_token(body: Body, reply: object) -> Asked[DecodeRow | None]:
    """Advance `body` up to its next decode row (None once it has ended), passing the rest through."""
    while True:
        try:
            item = body.send(reply)
        except StopIteration:
            return None
        if isinstance(item, Token):
            return item.row
        reply = yield item
