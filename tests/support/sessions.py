"""Session calls over a RunningServer's stub: Prefill parts, a whole Prefill, a greedy Decode."""

from __future__ import annotations

from proto.ladder.v1 import ladder_pb2 as pb
from tests.support.servers import RunningServer


def part(tokens: list[int], session_id: str = "") -> pb.PrefillRequest:
    return pb.PrefillRequest(session_id=session_id, prompt=pb.Prompt(tokens=pb.TokenIds(ids=tokens)))


def prefill(server: RunningServer, *parts: pb.PrefillRequest) -> list[pb.PrefillEvent]:
    return list(server.stub.Prefill(iter(parts)))


def decode(server: RunningServer, session_id: str, n: int) -> tuple[list[int], pb.Completion]:
    events = list(server.stub.Decode(pb.DecodeRequest(
        session_id=session_id, stopping=pb.StoppingOptions(max_new_tokens=n, ignore_eos=True))))
    return [e.token.id for e in events if e.HasField("token")], events[-1].done
