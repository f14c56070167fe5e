"""Text and stop strings at the call's side (service/front/texts.py), the worker giving token ids.

The door turns ids into text with the default model's real tokenizer; the scheduler's side runs on
the recording engine of test_scheduler_rounds (a token is its session's length), so a test can
hold the caller back and state what the worker did meanwhile: a Generate's sample runs past a stop
string and ends at the cut, a kept session (Decode) feeds nothing the caller has not judged and
ends holding exactly the tokens up to the one that completed the stop string. A real server
shows the same: a session a stop string ended goes on as one decoded to that token by length.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.executor.step import Rewind
from engine.sampling import Sampler, SamplingParams
from engine.tokenizer import Tokenizer
from proto.ladder.v1 import ladder_pb2 as pb
from service.calls import Stopping
from service.events import Finish, Finished, TokenOut
from service.front.texts import TextDoor
from service.worker.cuts import Cuts
from service.worker.generation import decode_steps
from service.worker.scheduler import Scheduler
from tests.service.test_scheduler_rounds import RecordingEngine, model
from tests.support.servers import RunningServer, server_config
from tests.support.sessions import part, prefill


@pytest.fixture(scope="module")
def tokenizer(default_model: Callable[..., Path]) -> Tokenizer:
    return Tokenizer(default_model("int4"))


def _ids(tokenizer: Tokenizer, text: str) -> list[int]:
    return [int(t) for t in tokenizer.encode(text)]


def _tokens(ids: list[int], sample: int = 0) -> list[TokenOut]:
    return [TokenOut(token, "", index, 0.0, None, sample) for index, token in enumerate(ids)]


def _text(events: list[Any]) -> str:
    return "".join(e.text for e in events if isinstance(e, TokenOut)) + "".join(
        e.tail for e in events if isinstance(e, Finished)
    )


def test_the_door_writes_the_text_the_worker_used_to_and_holds_a_stop_prefix_to_the_end(
    tokenizer: Tokenizer,
) -> None:
    ids = _ids(tokenizer, "The keeper climbed the stairs at dusk.")
    door = TextDoor(tokenizer, Stopping(32, stop=("dusk!",)), Cuts(lambda: None), ends_at_cut=True)
    events = door.see([*_tokens(ids), Finished(Finish.LENGTH, "", 0)])
    assert _text(events) == tokenizer.decode(ids)  # "dusk." never completes the stop: all of it
    assert [e.reason for e in events if isinstance(e, Finished)] == [Finish.LENGTH]
    assert door.cuts.cut == {}


def test_a_stop_string_ends_a_generate_sample_at_the_door_and_drops_what_the_worker_ran_past(
    tokenizer: Tokenizer,
) -> None:
    ids = _ids(tokenizer, "The keeper climbed the stairs at dusk and wrote in his notebook.")
    woken: list[int] = []
    cuts = Cuts(lambda: woken.append(1))
    door = TextDoor(tokenizer, Stopping(64, stop=("stairs",)), cuts, ends_at_cut=True)
    first = door.see(_tokens(ids)[:3])
    rest = door.see([*_tokens(ids)[3:], Finished(Finish.LENGTH, "", 0)])  # the worker ran on
    events = first + rest
    assert _text(events) == "The keeper climbed the "
    [cut] = cuts.cut.values()
    assert [e.index for e in events if isinstance(e, TokenOut)] == list(range(cut + 1))
    finishes = [e for e in events if isinstance(e, Finished)]
    assert [f.reason for f in finishes] == [Finish.STOP]  # the worker's own LENGTH is not the client's
    assert finishes[0] is events[-1] and events.index(finishes[0]) == cut + 1
    assert woken == []  # nobody waited: no nudge


def test_each_sample_has_its_own_text_and_its_own_cut(tokenizer: Tokenizer) -> None:
    a = _ids(tokenizer, "red, green and blue")
    b = _ids(tokenizer, "green, blue and red")
    cuts = Cuts(lambda: None)
    door = TextDoor(tokenizer, Stopping(32, stop=("blue",)), cuts, ends_at_cut=True)
    interleaved = [t for pair in zip(_tokens(a, 0), _tokens(b, 1), strict=False) for t in pair]
    events = door.see(interleaved)
    by_sample = {s: _text([e for e in events if getattr(e, "sample", None) == s]) for s in (0, 1)}
    assert by_sample == {0: "red, green and ", 1: "green, "}
    assert set(cuts.cut) == {0, 1}


def test_a_stop_string_is_not_looked_for_before_min_tokens(tokenizer: Tokenizer) -> None:
    ids = _ids(tokenizer, "go go go stop")
    first_go_tokens = len(_ids(tokenizer, "go"))
    door = TextDoor(
        tokenizer,
        Stopping(32, stop=("go",), min_new_tokens=first_go_tokens + 1),
        Cuts(lambda: None),
        ends_at_cut=True,
    )
    events = door.see(_tokens(ids))
    assert _text(events) == "go "  # the first "go" is within min_tokens; the second one stops


def test_a_verdict_wakes_the_worker_only_when_it_waits() -> None:
    woken: list[int] = []
    cuts = Cuts(lambda: woken.append(1))
    cuts.passes(0, 0)
    assert woken == [] and cuts.judged(0, 0)
    assert not cuts.judged(0, 1) and cuts.waiting  # not yet: the next verdict wakes it
    cuts.passes(0, 1)
    assert woken == [1] and not cuts.waiting and cuts.judged(0, 1)
    assert not cuts.judged(0, 2)
    cuts.stops(0, 2)
    assert woken == [1, 1] and cuts.judged(0, 5)  # a cut judges every later token too


# -- the worker's side: a slow caller, a kept session --------------------------------------------


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _decode(
    loop: asyncio.AbstractEventLoop,
    feed_last: bool,
    stop_at: int,
    delay_s: float,
    new: int = 12,
    step_s: float = 0.0,
) -> tuple[list[Any], Any, RecordingEngine]:
    """Decode `new` tokens on a session of 5 (the recording engine's token is the session's
    length), the caller judging each token `delay_s` after it arrives and cutting at `stop_at`;
    every engine step takes `step_s`."""
    engine = RecordingEngine(slots=2)
    engine.on_step = lambda step: time.sleep(step_s)
    session = engine._new()
    session.length, session.has_logits = 5, True
    scheduler = Scheduler(engine, max_queue=8)  # type: ignore[arg-type]
    cuts = Cuts(scheduler.wake)
    body = decode_steps(model(), session, Sampler(SamplingParams()), Stopping(new), feed_last, cuts=cuts)

    async def caller() -> list[Any]:
        seen: list[Any] = []
        async for events in scheduler.batches(body):
            for event in events:
                seen.append(event)
                if isinstance(event, TokenOut) and event.index <= stop_at and stop_at not in cuts.cut:
                    await asyncio.sleep(delay_s)
                    (cuts.stops if event.index == stop_at else cuts.passes)(0, event.index)
        return seen

    try:
        events = loop.run_until_complete(asyncio.wait_for(caller(), 10))
    finally:
        scheduler.stop()
    return events, session, engine


@pytest.mark.parametrize("delay_s", [0.0, 0.05])
def test_a_kept_session_ends_holding_the_tokens_up_to_the_cut_however_slow_the_caller(
    loop: asyncio.AbstractEventLoop, delay_s: float
) -> None:
    events, session, engine = _decode(loop, feed_last=True, stop_at=3, delay_s=delay_s)
    emitted = [e.id for e in events if isinstance(e, TokenOut)]
    assert emitted[:4] == [5, 6, 7, 8]  # token i is chosen at length 5 + i
    assert len(emitted) <= 5  # the worker ran at most one token past the stop string
    assert session.length == 5 + 4  # the four tokens up to the cut, fed; nothing after
    [finished] = [e for e in events if isinstance(e, Finished)]
    assert (finished.reason, finished.session_length) == (Finish.STOP, 9)
    assert not any(isinstance(op, Rewind) for step in engine.steps for op in step.ops)


def test_a_generate_sample_runs_past_a_slow_caller_and_ends_at_its_cut(
    loop: asyncio.AbstractEventLoop,
) -> None:
    events, _, _ = _decode(loop, feed_last=False, stop_at=2, delay_s=0.05, step_s=0.02)
    emitted = [e.index for e in events if isinstance(e, TokenOut)]
    assert emitted[:3] == [0, 1, 2] and len(emitted) < 12  # ran on, then saw the cut and ended
    [finished] = [e for e in events if isinstance(e, Finished)]
    assert finished.reason is Finish.STOP


def test_a_kept_session_waits_for_its_verdicts_without_holding_other_streams(
    loop: asyncio.AbstractEventLoop,
) -> None:
    engine = RecordingEngine(slots=2)
    kept, other = engine._new(), engine._new()
    for session in (kept, other):
        session.length, session.has_logits = 5, True
    scheduler = Scheduler(engine, max_queue=8)  # type: ignore[arg-type]
    cuts = Cuts(scheduler.wake)
    release = threading.Event()
    slow = decode_steps(model(), kept, Sampler(SamplingParams()), Stopping(8), True, cuts=cuts)
    free = decode_steps(model(), other, Sampler(SamplingParams()), Stopping(8), False)

    async def judge_late() -> int:
        count = 0
        async for events in scheduler.batches(slow):
            for event in events:
                if isinstance(event, TokenOut):
                    count += 1
                    await asyncio.to_thread(release.wait, 5)  # judged only once the other has ended
                    cuts.passes(0, event.index)
        return count

    async def both() -> tuple[int, list[Any]]:
        judged = asyncio.ensure_future(judge_late())
        other_events = [e async for e in scheduler.stream(free)]
        release.set()
        return await judged, other_events

    try:
        judged, other_events = loop.run_until_complete(asyncio.wait_for(both(), 10))
    finally:
        scheduler.stop()
    assert [e.id for e in other_events if isinstance(e, TokenOut)] == list(range(5, 13))  # never held
    assert judged == 8 and kept.length == 5 + 8  # the kept session went on once judged: all 8 fed


# -- through a real server: a session a stop string ended is the session decoded to that token ------


@pytest.fixture(scope="module")
def server(default_model: Callable[..., Path]) -> Iterator[RunningServer]:
    with RunningServer(server_config(default_model("int4"), max_sessions=4, capacity=512)) as running:
        yield running


def _walk(
    server: RunningServer, ids: list[int], first: pb.StoppingOptions
) -> tuple[list[int], int, list[int]]:
    """A session prefilled with `ids`, decoded with `first`, then 12 more tokens: (the first
    Decode's tokens, the session's length after it, the next Decode's tokens)."""
    session = prefill(server, part(ids, last=True))[-1].done.session_id
    try:
        done = list(server.stub.Decode(pb.DecodeRequest(session_id=session, stopping=first)))[-1].done
        more = pb.StoppingOptions(max_new_tokens=12, ignore_eos=True)
        after = list(server.stub.Decode(pb.DecodeRequest(session_id=session, stopping=more)))[-1].done
        return list(done.token_ids), done.session_length, list(after.token_ids)
    finally:
        server.stub.CloseSession(pb.CloseSessionRequest(session_id=session))


def test_a_session_a_stop_string_ended_goes_on_as_one_decoded_to_that_token(server: RunningServer) -> None:
    ids = list(server.stub.Tokenize(pb.TokenizeRequest(text="The three primary colors are")).ids)
    free = _walk(server, ids, pb.StoppingOptions(max_new_tokens=24, ignore_eos=True))
    text = server.stub.Detokenize(pb.DetokenizeRequest(ids=free[0])).text
    stop = text[len(text) // 2 : len(text) // 2 + 3].strip() or text[-3:]
    stopped = _walk(server, ids, pb.StoppingOptions(max_new_tokens=24, ignore_eos=True, stop=[stop]))
    assert stopped[0] and len(stopped[0]) < len(free[0])  # the stop string ended it early
    assert stopped[0] == free[0][: len(stopped[0])]
    by_length = _walk(server, ids, pb.StoppingOptions(max_new_tokens=len(stopped[0]), ignore_eos=True))
    assert stopped[1:] == by_length[1:]  # the same length, and the same tokens after it
