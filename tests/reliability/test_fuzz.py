"""A seeded fuzz of every Ladder RPC against one real server: bad input costs its own call and nothing else.

Thousands of calls over a real channel, all as raw bytes so nothing on the client
side cleans them up: random garbage, valid messages with bytes mutated, strings
that are not UTF-8, NaN / infinite / negative / huge numbers, empty, huge and
control-character session ids, Prefill streams in the wrong order, 1 ms
deadlines. The same seed makes the same calls (the live session ids in them
depend on how earlier calls went). Every call must end OK or with a
documented status (never UNKNOWN or INTERNAL), no status may echo a large input,
health must stay SERVING, and every session the fuzz opened is closed by the end.
"""

from __future__ import annotations

import random
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc

from proto.ladder.v1 import ladder_pb2 as pb
from tests.support.servers import RunningServer, server_config

SEED = 20261130
CASES = 2400
IDLE_SECONDS = 2.0  # sessions orphaned by a deadline that struck after their Prefill finished expire
Code = grpc.StatusCode
# The documented codes a lone caller can meet. RESOURCE_EXHAUSTED is left out: calls one at a
# time never fill the queue, so it would mean something else (a status too large to send, say).
DOCUMENTED = frozenset(
    {
        Code.OK,
        Code.INVALID_ARGUMENT,
        Code.OUT_OF_RANGE,
        Code.NOT_FOUND,
        Code.FAILED_PRECONDITION,
        Code.ABORTED,
        Code.CANCELLED,
        Code.DEADLINE_EXCEEDED,
    }
)
RPCS = {
    "Generate": "unary",
    "GenerateStream": "stream",
    "Prefill": "bidi",
    "Decode": "stream",
    "Rewind": "unary",
    "CloseSession": "unary",
    "Tokenize": "unary",
    "Detokenize": "unary",
    "GetModelInfo": "unary",
    "GetEngineStats": "unary",
}
POD_NAME = re.compile(r"[A-Za-z0-9_-]{1,105}")
MAX_DETAILS = 512

NAN, INF = float("nan"), float("inf")
FLOATS = (NAN, INF, -INF, -1.0, -0.0, 0.0, 1e-45, 1e-38, 1e-3, 0.5, 1.0, 2.0, 100.0, 101.0, 1e38, 3.4e38)
INT32S = (-(2**31), -1, 0, 1, 3, 255, 511, 512, 2**31 - 1)
UINT32S = (0, 1, 2, 5, 16, 17, 1024, 2**32 - 1)
UINT64S = (0, 1, 7, 2**63, 2**64 - 1)
BAD_UTF8 = (b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xc0\xaf", b"ok\xe2\x82")
TEXT_PIECES = ("a", "The ", "é", "😀", "\x00", "\x1b[31m", "\n", "<|im_start|>", "<|im_end|>", " ", "\ufffd")


@dataclass
class Case:
    rpc: str
    payloads: list[bytes]
    label: str
    timeout: float = 10.0


@dataclass
class Tally:
    codes: Counter[Code] = field(default_factory=Counter)
    labels: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    opened: int = 0
    closed: int = 0
    cut_prefills: int = 0  # Prefills ended by their deadline: each may have opened a session nobody heard of


# -- the wire: length-delimited fields written by hand, so strings need not be UTF-8 ----------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _wire(message: Message) -> bytes:
    return message.SerializeToString()


def _tokens(ids: list[int]) -> pb.Prompt:
    return pb.Prompt(tokens=pb.TokenIds(ids=ids))


class Fuzzer:
    """Makes the cases from one seed, calls the server, and keeps count of what it saw."""

    def __init__(self, server: RunningServer, seed: int) -> None:
        self.rng = random.Random(seed)
        self.server = server
        self.live: list[str] = []  # sessions opened and not yet closed
        self.closed: list[str] = []
        self.tally = Tally()
        channel = server.channel
        kinds = {"unary": channel.unary_unary, "stream": channel.unary_stream, "bidi": channel.stream_stream}
        self.calls = {rpc: kinds[kind](f"/ladder.v1.Ladder/{rpc}") for rpc, kind in RPCS.items()}

    # -- values ------------------------------------------------------------------------------
    def text(self) -> str:
        if self.rng.random() < 0.02:  # over the ceiling (1024 tokens x 32 bytes): refused before tokenizing
            return "x" * 33_000
        return "".join(self.rng.choice(TEXT_PIECES) for _ in range(self.rng.randint(0, 12)))

    def prompt(self) -> pb.Prompt:
        kind = self.rng.choice(("tokens", "tokens", "text", "chat", "none"))
        if kind == "tokens":
            length = self.rng.choice((0, 1, 3, 8, 40, 1025))
            ids = [
                self.rng.choice(INT32S) if self.rng.random() < 0.05 else self.rng.randint(3, 500)
                for _ in range(length)
            ]
            return _tokens(ids)
        if kind == "text":
            return pb.Prompt(text=self.text())
        if kind == "chat":
            roles = ("system", "user", "assistant", "", "tool\n")
            turns = [
                pb.ChatMessage(role=self.rng.choice(roles), content=self.text())
                for _ in range(self.rng.randint(0, 3))
            ]
            return pb.Prompt(chat=pb.Chat(messages=turns))
        return pb.Prompt()

    def sampling(self) -> pb.SamplingOptions:
        options = pb.SamplingOptions()
        if self.rng.random() < 0.5:
            return options
        options.temperature = self.rng.choice(FLOATS)
        options.top_k = self.rng.choice(INT32S + (2**20, 2**20 + 1))
        for name in ("top_p", "repetition_penalty"):
            if self.rng.random() < 0.5:
                setattr(options, name, self.rng.choice(FLOATS))
        if self.rng.random() < 0.5:
            options.seed = self.rng.choice(UINT64S)
        return options

    def stopping(self) -> pb.StoppingOptions:
        options = pb.StoppingOptions(
            max_new_tokens=self.rng.choice((1, 2, 4) + UINT32S), ignore_eos=self.rng.random() < 0.5
        )
        if self.rng.random() < 0.3:
            count = self.rng.choice((1, 2, 16, 17))
            size = self.rng.choice((0, 1, 3, 512, 513))
            options.stop.extend(("ab" * size)[:size] or self.text() for _ in range(count))
        if self.rng.random() < 0.2:
            options.stop_token_ids.extend(self.rng.choice(INT32S) for _ in range(self.rng.randint(1, 4)))
        return options

    def pick(self, ids: list[str]) -> str:
        """One of `ids` ("" if none), drawing the same from the generator whatever `ids` holds."""
        at = self.rng.random()
        return ids[int(at * len(ids))] if ids else ""

    def session_id(self) -> str:
        live = self.pick(self.live)
        return self.rng.choice(
            (
                live,
                live,
                live,
                self.pick(self.closed),
                "",
                "pod-a.",
                "a" * 20_000,
                "pod-b." + "b" * 20_000,
                "pod-a.\x00\x01\x1b",
                "pod-a.é",
                "pod-b.abc",
                ".abc",
                "pod-a.nope",
                "pod-a/../etc",
                live + "x",
                "pod-a." + "z" * 200,
                "\r\nladder-session-owner: x",
            )
        )

    # -- messages of each RPC ----------------------------------------------------------------
    def message(self, rpc: str) -> list[bytes]:
        if rpc in ("Generate", "GenerateStream"):
            request = pb.GenerateRequest(
                prompt=self.prompt(), sampling=self.sampling(), stopping=self.stopping()
            )
        elif rpc == "Prefill":
            return [_wire(m) for m in self.prefill_parts()]
        elif rpc == "Decode":
            request = pb.DecodeRequest(
                session_id=self.session_id(), sampling=self.sampling(), stopping=self.stopping()
            )
        elif rpc == "Rewind":
            request = pb.RewindRequest(session_id=self.session_id(), length=self.rng.choice(UINT32S))
        elif rpc == "CloseSession":
            request = pb.CloseSessionRequest(session_id=self.session_id())
        elif rpc == "Tokenize":
            prompt = self.prompt()
            request = (
                pb.TokenizeRequest(chat=prompt.chat)
                if prompt.HasField("chat")
                else pb.TokenizeRequest(text=self.text())
            )
        elif rpc == "Detokenize":
            request = pb.DetokenizeRequest(ids=list(self.prompt().tokens.ids))
        else:
            request = pb.GetModelInfoRequest() if rpc == "GetModelInfo" else pb.GetEngineStatsRequest()
        return [_wire(request)]

    def prefill_parts(self) -> list[pb.PrefillRequest]:
        """Mostly well ordered; sometimes no parts, parts without a prompt, or first-only fields later."""
        first = pb.PrefillRequest(
            session_id=self.session_id() if self.rng.random() < 0.4 else "",
            prompt=self.prompt(),
            sampling=self.sampling(),
        )
        if self.rng.random() < 0.1:
            first.ClearField("prompt")
        parts = [first] if self.rng.random() > 0.05 else []
        for _ in range(self.rng.choice((0, 0, 1, 3))):
            later = pb.PrefillRequest(prompt=self.prompt())
            if self.rng.random() < 0.3:
                later.session_id, later.sampling.temperature = self.session_id(), self.rng.choice(FLOATS)
            parts.append(later)
        return parts

    # -- the kinds of case -------------------------------------------------------------------
    def garbage(self) -> Case:
        rpc = self.rng.choice(list(RPCS))
        count = self.rng.randint(1, 3) if RPCS[rpc] == "bidi" else 1
        sizes = (0, 1, 2, 5, 16, 64, 512, 4096)
        return Case(rpc, [self.rng.randbytes(self.rng.choice(sizes)) for _ in range(count)], "garbage")

    def mutated(self) -> Case:
        rpc = self.rng.choice(list(RPCS))
        payloads = self.message(rpc) or [b""]
        at = self.rng.randrange(len(payloads))
        payloads[at] = self.mutate(payloads[at])
        return Case(rpc, payloads, "mutated bytes")

    def mutate(self, data: bytes) -> bytes:
        out = bytearray(data)
        for _ in range(self.rng.randint(1, 3)):
            where = self.rng.randint(0, len(out))
            kind = self.rng.randrange(4)
            if kind == 0 and out:
                out[min(where, len(out) - 1)] ^= 1 << self.rng.randrange(8)
            elif kind == 1:
                out[where:where] = self.rng.randbytes(self.rng.randint(1, 4))
            elif kind == 2:
                del out[where : where + self.rng.randint(1, 4)]
            else:
                out = out[:where]
        return bytes(out)

    def bad_utf8(self) -> Case:
        bad = self.rng.choice(BAD_UTF8)
        rpc, payload = self.rng.choice(
            (
                ("Generate", _field(1, _field(1, bad))),  # prompt.text
                ("GenerateStream", _field(1, _field(2, _field(1, _field(2, bad))))),  # prompt.chat...content
                ("Generate", _field(1, _field(2, _field(1, _field(1, bad))))),  # prompt.chat.messages.role
                ("GenerateStream", _field(3, _field(2, bad))),  # stopping.stop
                ("Tokenize", _field(1, bad)),
                ("Decode", _field(1, bad)),
                ("Rewind", _field(1, bad)),
                ("CloseSession", _field(1, bad)),
                ("Prefill", _field(1, bad)),
                ("Prefill", _field(2, _field(1, bad))),  # prompt.text
            )
        )
        payloads = [payload]
        if rpc == "Prefill" and self.rng.random() < 0.5:  # a good first part, then the bad one
            payloads.insert(0, _wire(pb.PrefillRequest(prompt=_tokens([5, 6]))))
        return Case(rpc, payloads, "invalid UTF-8")

    def fields(self) -> Case:
        rpc = self.rng.choice(list(RPCS))
        return Case(rpc, self.message(rpc), "mutated fields")

    def sessions(self) -> Case:
        rpc = self.rng.choice(("Decode", "Rewind", "CloseSession", "Prefill"))
        if rpc == "Prefill":
            part = pb.PrefillRequest(session_id=self.session_id(), prompt=_tokens([7]))
            return Case(rpc, [_wire(part)], "session ids")
        return Case(rpc, self.message(rpc), "session ids")

    def deadline(self) -> Case:
        case = self.rng.choice((self.fields, self.valid))()
        case.timeout, case.label = 0.001, "1 ms deadline"
        return case

    def valid(self) -> Case:
        """Ordinary calls, so sessions open, decode, rewind and close among the bad ones."""
        tokens = _tokens([self.rng.randint(3, 500) for _ in range(self.rng.randint(1, 70))])
        session, n = self.pick(self.live), self.rng.randint(1, 20)
        rpc = self.rng.choice(("open", "Prefill", "Decode", "Rewind", "Generate"))
        if rpc in ("open", "Prefill") or not session:
            extend = session if rpc == "Prefill" else ""
            return Case("Prefill", [_wire(pb.PrefillRequest(session_id=extend, prompt=tokens))], "valid")
        if rpc == "Decode":
            stopping = pb.StoppingOptions(max_new_tokens=n % 6 + 1)
            return Case(rpc, [_wire(pb.DecodeRequest(session_id=session, stopping=stopping))], "valid")
        if rpc == "Rewind":
            return Case(rpc, [_wire(pb.RewindRequest(session_id=session, length=n))], "valid")
        stopping = pb.StoppingOptions(max_new_tokens=3)
        return Case(rpc, [_wire(pb.GenerateRequest(prompt=tokens, stopping=stopping))], "valid")

    # -- running -----------------------------------------------------------------------------
    def next_case(self) -> Case:
        makers: tuple[Callable[[], Case], ...] = (
            self.garbage,
            self.mutated,
            self.bad_utf8,
            self.fields,
            self.fields,
            self.sessions,
            self.deadline,
            self.valid,
            self.valid,
        )
        return self.rng.choice(makers)()

    def call(self, case: Case) -> tuple[Code, list[bytes], grpc.RpcError | None]:
        call = self.calls[case.rpc]
        try:
            if RPCS[case.rpc] == "bidi":
                return Code.OK, list(call(iter(case.payloads), timeout=case.timeout)), None
            if RPCS[case.rpc] == "stream":
                return Code.OK, list(call(case.payloads[0], timeout=case.timeout)), None
            return Code.OK, [call(case.payloads[0], timeout=case.timeout)], None
        except grpc.RpcError as error:
            return error.code(), [], error

    def run(self, case: Case) -> None:
        code, responses, error = self.call(case)
        self.tally.codes[code] += 1
        self.tally.labels[case.label] += 1
        where = f"{case.label} {case.rpc} {[p[:40] for p in case.payloads]!r}"
        if code not in DOCUMENTED:
            self.tally.violations.append(f"{code.name} from {where}: {error.details() if error else ''}")
        if error is not None:
            self.check_error(error, where)
        if code == Code.OK:
            self.follow(case, responses)
        elif code == Code.DEADLINE_EXCEEDED and case.rpc == "Prefill":
            self.tally.cut_prefills += 1

    def check_error(self, error: grpc.RpcError, where: str) -> None:
        details = error.details() or ""
        if len(details) > MAX_DETAILS:
            self.tally.violations.append(f"details of {len(details)} characters from {where}")
        for key, value in error.trailing_metadata() or ():
            if key == "ladder-session-owner" and not POD_NAME.fullmatch(str(value)):
                self.tally.violations.append(f"owner trailer {str(value)[:40]!r} from {where}")

    def follow(self, case: Case, responses: list[bytes]) -> None:
        """Keep track of the sessions that calls opened and closed."""
        if case.rpc == "Prefill":
            opened = pb.PrefillEvent.FromString(responses[-1]).done.session_id
            if opened not in self.live:
                self.live.append(opened)
                self.tally.opened += 1
                while len(self.live) > 4:
                    self.close(self.live[0])
        elif case.rpc == "CloseSession":
            gone = pb.CloseSessionResponse.FromString(responses[0]).session_id
            if gone in self.live:
                self.live.remove(gone)
                self.closed.append(gone)
                self.tally.closed += 1

    def close(self, session_id: str) -> None:
        """Close a session the fuzz opened (NOT_FOUND: it expired while idle)."""
        self.live.remove(session_id)
        self.closed.append(session_id)
        for _ in range(1200):  # a bound of a minute, for a loaded machine; it breaks as soon as it can
            try:
                self.server.stub.CloseSession(pb.CloseSessionRequest(session_id=session_id), timeout=10)
                break
            except grpc.RpcError as error:  # ABORTED: a call a deadline cut short still holds it
                assert error.code() in (Code.NOT_FOUND, Code.ABORTED), error
                if error.code() == Code.NOT_FOUND:
                    break
                time.sleep(0.05)
        self.tally.closed += 1


def health(server: RunningServer) -> int:
    request = health_pb2.HealthCheckRequest(service="ladder.v1.Ladder")
    return int(health_pb2_grpc.HealthStub(server.channel).Check(request, timeout=10).status)


def sessions_open_once_idle(server: RunningServer) -> int:
    """EngineStats.sessions_open, once sessions orphaned by a deadline have had time to expire."""
    deadline = time.monotonic() + 3 * IDLE_SECONDS + 60  # a bound for a loaded machine, not a pace
    while (open_now := server.stats().sessions_open) and time.monotonic() < deadline:
        time.sleep(0.1)
    return open_now


@dataclass
class Outcome:
    tally: Tally
    health: int  # at the end
    open_when_closed: int  # sessions_open once the fuzz closed every session it knew of
    open_once_idle: int  # and once the idle period has passed


@pytest.fixture(scope="module")
def server(served_model: Path) -> Iterator[RunningServer]:
    with RunningServer(
        server_config(served_model, max_new_tokens=16, session_idle_seconds=IDLE_SECONDS)
    ) as running:
        yield running


@pytest.fixture(scope="module")
def fuzzed(server: RunningServer) -> Outcome:
    """Runs the fuzz once."""
    fuzzer = Fuzzer(server, SEED)
    started = time.perf_counter()
    for index in range(CASES):
        fuzzer.run(fuzzer.next_case())
        if index % 500 == 499:
            assert health(server) == health_pb2.HealthCheckResponse.SERVING, f"after {index + 1} cases"
    for session_id in list(fuzzer.live):
        fuzzer.close(session_id)
    tally, seconds = fuzzer.tally, time.perf_counter() - started
    outcome = Outcome(tally, health(server), server.stats().sessions_open, sessions_open_once_idle(server))
    print(
        f"fuzz: {CASES} cases in {seconds:.1f} s; {dict(tally.labels)}; "
        f"{ {c.name: n for c, n in tally.codes.items()} }; sessions opened {tally.opened}, "
        f"closed {tally.closed}, orphaned by a deadline {outcome.open_when_closed}"
    )
    return outcome


def test_every_fuzzed_call_ends_ok_or_with_a_documented_status(fuzzed: Outcome) -> None:
    tally = fuzzed.tally
    assert sum(tally.codes.values()) == CASES >= 2000
    assert not tally.violations, "\n".join(tally.violations[:20])
    assert tally.codes[Code.INVALID_ARGUMENT] and tally.codes[Code.OK] and tally.codes[Code.DEADLINE_EXCEEDED]


def test_the_server_stays_serving_and_every_session_the_fuzz_opened_is_closed(
    server: RunningServer, fuzzed: Outcome
) -> None:
    tally = fuzzed.tally
    assert fuzzed.health == health_pb2.HealthCheckResponse.SERVING and server.server.fault is None
    assert tally.opened > 50 and tally.closed == tally.opened
    # Only a Prefill cut short by its deadline after it opened a session leaves one behind; it expires.
    assert fuzzed.open_when_closed <= tally.cut_prefills
    assert fuzzed.open_once_idle == 0
    request = pb.GenerateRequest(prompt=_tokens([5, 6]), stopping=pb.StoppingOptions(max_new_tokens=2))
    assert len(server.stub.Generate(request).token_ids) == 2
