"""A cancellation matrix against a real server: every way a call can end early, at every phase.

Endings: the client cancels; its deadline passes; its process is killed (SIGKILL) mid-call.
Phases: a Prefill opening a session (before its first event, mid-prompt after ForwardEvents,
after its last part but before done), the same for a Prefill extending a session, a Decode
and a GenerateStream mid-stream. Whatever the ending and the phase, the server counts the call
with the ending's code, returns every KV slot the call held, and leaves a session the call
extended exactly as it was: same length, same greedy continuation.

Phases are made exact by holding the engine worker inside a call (`frozen`): while it is held,
nothing the call asked for runs, so the client can end the call at a known point.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import Message

from proto.ladder.v1 import ladder_pb2 as pb
from tests.support.prompts import greedy_request, prompt_ids
from tests.support.servers import RunningServer, server_config
from tests.support.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 1.0  # long enough for a client to reach any phase, short enough to wait out
BASE = prompt_ids(50, seed=61)  # the session an extending Prefill or a Decode works on
PART_A = prompt_ids(100, seed=62)  # two forwards at chunk 64
PART_B = prompt_ids(30, seed=63)  # one forward
ENDINGS = ("cancel", "deadline", "kill")
CODES = {"cancel": "CANCELLED", "deadline": "DEADLINE_EXCEEDED", "kill": "CANCELLED"}

# The killed client: it starts the call from serialized requests, prints the kind of every
# event it receives, and half-closes a Prefill's request stream when told to on stdin.
CHILD = r"""
import json, sys, threading
import grpc
from proto.ladder.v1 import ladder_pb2 as pb, ladder_pb2_grpc
spec = json.loads(sys.argv[1])
stub = ladder_pb2_grpc.LadderStub(grpc.insecure_channel(spec["address"]))
requests = [getattr(pb, spec["type"]).FromString(bytes.fromhex(r)) for r in spec["requests"]]
closing = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), closing.set()), daemon=True).start()
def parts():
    yield from requests
    closing.wait()
call = getattr(stub, spec["rpc"])
for event in (call(parts()) if spec["rpc"] == "Prefill" else call(requests[0])):
    print(event.WhichOneof("event"), flush=True)
"""


class InProcessClient:
    """A call on the test's own channel, ended by cancelling it or by letting its deadline pass."""

    def __init__(self, running: RunningServer, rpc: str, requests: list[Message], ending: str) -> None:
        self.ending = ending
        self.closing = threading.Event()
        call = getattr(running.stub, rpc)
        timeout = DEADLINE_S if ending == "deadline" else None
        self.events = (
            call(self._parts(requests), timeout=timeout)
            if rpc == "Prefill"
            else call(requests[0], timeout=timeout)
        )

    def _parts(self, requests: list[Message]) -> Iterator[Message]:
        yield from requests
        self.closing.wait(60)  # the request stream stays open until half_close

    def expect(self, kind: str, count: int) -> None:
        for _ in range(count):
            assert next(self.events).WhichOneof("event") == kind

    def half_close(self) -> None:
        self.closing.set()

    def end(self) -> None:
        if self.ending == "cancel":
            self.events.cancel()
        else:
            with pytest.raises(grpc.RpcError) as caught:
                for _ in self.events:
                    pass
            assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        self.closing.set()


class KilledClient:
    """A call made by a child process, ended by SIGKILL."""

    started: list[subprocess.Popen[str]] = []  # killed after each test, however it ended

    def __init__(self, running: RunningServer, rpc: str, requests: list[Message], ending: str) -> None:
        spec = {
            "address": running.address,
            "rpc": rpc,
            "type": type(requests[0]).__name__,
            "requests": [r.SerializeToString().hex() for r in requests],
        }
        self.process = subprocess.Popen(
            [sys.executable, "-c", CHILD, json.dumps(spec)],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.started.append(self.process)

    def expect(self, kind: str, count: int) -> None:
        assert self.process.stdout is not None
        for _ in range(count):
            assert self.process.stdout.readline().strip() == kind

    def half_close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("close\n")
        self.process.stdin.flush()

    def end(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)


Client = InProcessClient | KilledClient


def start(running: RunningServer, rpc: str, requests: list[Message], ending: str) -> Client:
    kind = KilledClient if ending == "kill" else InProcessClient
    return kind(running, rpc, requests, ending)


class Counted:
    """The server's count of `method` calls that ended with the ending's code (ladder_calls)."""

    def __init__(self, running: RunningServer, method: str, ending: str) -> None:
        self.running, self.method, self.code = running, method, CODES[ending]
        self.before = self.value()

    def value(self) -> float:
        return self.running.calls(self.method, self.code)

    def wait_for_one_more(self) -> None:
        """Until the server has seen the call end (inside `frozen`: before anything it left runs on)."""
        wait_for(lambda: self.value() == self.before + 1)


def parts(session_id: str, *prompts: list[int]) -> list[Message]:
    """The messages of a Prefill: the session id on the first only (a later one is INVALID_ARGUMENT)."""
    return [
        pb.PrefillRequest(
            session_id=session_id if index == 0 else "", prompt=pb.Prompt(tokens=pb.TokenIds(ids=p))
        )
        for index, p in enumerate(prompts)
    ]


def end_prefill_at(running: RunningServer, phase: str, ending: str, session_id: str) -> None:
    """Start a Prefill (opening a session when `session_id` is empty) and end it at `phase`; return
    once the server has seen it end."""
    counted = Counted(running, "Prefill", ending)
    if phase == "before the first event":
        with running.frozen() as scheduler:
            depth = scheduler.depth
            client = start(running, "Prefill", parts(session_id, PART_A), ending)
            wait_for(lambda: scheduler.depth > depth)  # its first job waits on the held worker
            client.end()
            counted.wait_for_one_more()
    elif phase == "mid-prompt":
        client = start(running, "Prefill", parts(session_id, PART_A), ending)
        client.expect("forward", 2)  # the server now waits for the next part
        client.end()
        counted.wait_for_one_more()
    else:  # after its last part, before done
        client = start(running, "Prefill", parts(session_id, PART_A, PART_B), ending)
        client.expect("forward", 3)
        with running.frozen() as scheduler:
            submitted = scheduler.submitted
            client.half_close()
            wait_for(lambda: scheduler.submitted > submitted)  # the final call waits on the held worker
            client.end()
            counted.wait_for_one_more()


def open_base_session(running: RunningServer) -> str:
    events = list(running.stub.Prefill(iter(parts("", BASE)), timeout=20))
    return events[-1].done.session_id  # type: ignore[no-any-return]


def close_session(running: RunningServer, session_id: str) -> None:
    running.stub.CloseSession(pb.CloseSessionRequest(session_id=session_id), timeout=20)


def decode_when_free(running: RunningServer, session_id: str, n: int) -> tuple[list[int], pb.Completion]:
    """Decode `n` greedy tokens once the ended call has let go of the session."""
    request = pb.DecodeRequest(
        session_id=session_id, stopping=pb.StoppingOptions(max_new_tokens=n, ignore_eos=True)
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            events = list(running.stub.Decode(request, timeout=20))
            return [e.token.id for e in events if e.HasField("token")], events[-1].done
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.ABORTED and time.monotonic() < deadline
            time.sleep(0.005)


@pytest.fixture(scope="module")
def running(served_model: Path) -> Iterator[RunningServer]:
    # Prefix sharing off: these tests count a prompt's forwards, which a held prefix would shorten.
    with RunningServer(
        server_config(served_model, max_sessions=4, max_new_tokens=1000, prefix_sharing=False)
    ) as server:
        yield server


@pytest.fixture(autouse=True)
def no_child_left() -> Iterator[None]:
    yield
    while KilledClient.started:
        process = KilledClient.started.pop()
        process.kill()
        process.wait(timeout=10)


@pytest.fixture
def session_id(running: RunningServer) -> Iterator[str]:
    """A session holding BASE, closed after the test if the test did not close it."""
    opened = open_base_session(running)
    yield opened
    try:
        close_session(running, opened)
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.NOT_FOUND  # the test closed it


@pytest.fixture(scope="module")
def continuation(running: RunningServer) -> list[int]:
    """The greedy tokens that follow BASE."""
    return list(running.stub.Generate(greedy_request(BASE, 4), timeout=20).token_ids)


PREFILL_PHASES = ("before the first event", "mid-prompt", "after the last part")


@pytest.mark.parametrize("phase", PREFILL_PHASES)
@pytest.mark.parametrize("ending", ENDINGS)
def test_a_prefill_that_opened_a_session_and_did_not_finish_returns_its_slot(
    running: RunningServer, ending: str, phase: str
) -> None:
    baseline = running.stats().sessions_open
    end_prefill_at(running, phase, ending, session_id="")
    wait_for(lambda: running.stats().sessions_open == baseline)


@pytest.mark.parametrize("phase", PREFILL_PHASES)
@pytest.mark.parametrize("ending", ENDINGS)
def test_a_prefill_that_extended_a_session_and_did_not_finish_leaves_it_as_it_was(
    running: RunningServer, continuation: list[int], session_id: str, ending: str, phase: str
) -> None:
    baseline = running.stats().sessions_open - 1
    end_prefill_at(running, phase, ending, session_id)
    tokens, done = decode_when_free(running, session_id, 4)
    assert done.session_length == len(BASE) + 4 and tokens == continuation
    close_session(running, session_id)
    wait_for(lambda: running.stats().sessions_open == baseline)


@pytest.mark.parametrize("ending", ENDINGS)
def test_a_decode_ended_mid_stream_keeps_its_session_consistent_and_usable(
    running: RunningServer, session_id: str, ending: str
) -> None:
    baseline, counted = running.stats().sessions_open - 1, Counted(running, "Decode", ending)
    request = pb.DecodeRequest(
        session_id=session_id, stopping=pb.StoppingOptions(max_new_tokens=600, ignore_eos=True)
    )
    client = start(running, "Decode", [request], ending)
    client.expect("token", 3)
    with running.frozen():
        client.end()
        counted.wait_for_one_more()
    tokens, done = decode_when_free(running, session_id, 3)
    held = done.session_length - 3 - len(BASE)  # the tokens the ended Decode fed
    assert held >= 2
    assert tokens == list(running.stub.Generate(greedy_request(BASE, held + 3), timeout=20).token_ids)[held:]
    close_session(running, session_id)
    wait_for(lambda: running.stats().sessions_open == baseline)


@pytest.mark.parametrize("ending", ENDINGS)
def test_a_generate_stream_ended_mid_stream_returns_its_slot(running: RunningServer, ending: str) -> None:
    baseline, counted = running.stats().sessions_open, Counted(running, "GenerateStream", ending)
    client = start(running, "GenerateStream", [greedy_request(BASE, 600)], ending)
    client.expect("token", 3)
    with running.frozen():
        client.end()
        counted.wait_for_one_more()
    wait_for(lambda: running.stats().sessions_open == baseline)
