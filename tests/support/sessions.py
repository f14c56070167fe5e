"""Session calls over a RunningServer's stub: Prefill parts, a whole Prefill, a greedy Decode."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from proto.ladder.v1 import ladder_pb2 as pb
from tests.support.servers import RunningServer


def part(tokens: list[int], session_id: str = "", last: bool = False) -> pb.PrefillRequest:
    return pb.PrefillRequest(
        session_id=session_id, prompt=pb.Prompt(tokens=pb.TokenIds(ids=tokens)), last=last
    )


def held_open(*messages: pb.PrefillRequest) -> tuple[Iterator[pb.PrefillRequest], threading.Event]:
    """The messages, then a request stream that stays open (no half-close) until the event is set."""
    release = threading.Event()

    def stream() -> Iterator[pb.PrefillRequest]:
        yield from messages
        release.wait(30)

    return stream(), release


def prefill(server: RunningServer, *parts: pb.PrefillRequest) -> list[pb.PrefillEvent]:
    return list(server.stub.Prefill(iter(parts)))


def decode(server: RunningServer, session_id: str, n: int) -> tuple[list[int], pb.Completion]:
    events = list(
        server.stub.Decode(
            pb.DecodeRequest(
                session_id=session_id, stopping=pb.StoppingOptions(max_new_tokens=n, ignore_eos=True)
            )
        )
    )
    return [e.token.id for e in events if e.HasField("token")], events[-1].done
