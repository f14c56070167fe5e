"""x-request-id: a caller's id is echoed in the trailers when it could name a session; any other is
replaced by one of the server's own, so logs and trailers never carry what a caller slipped in."""

from __future__ import annotations

import re

import pytest

from proto.ladder.v1 import ladder_pb2 as pb
from tests.support.servers import RunningServer


def trailer_id(server: RunningServer, asked: str) -> str:
    metadata = (("x-request-id", asked),)
    _, call = server.stub.GetModelInfo.with_call(pb.GetModelInfoRequest(), metadata=metadata)
    return str(dict(call.trailing_metadata())["x-request-id"])


def test_a_plain_request_id_is_echoed(server: RunningServer) -> None:
    assert trailer_id(server, "order-42.retry_1") == "order-42.retry_1"


@pytest.mark.parametrize("asked", ["x" * 129, "has space", "semi;colon"])
def test_an_overlong_or_odd_request_id_is_replaced_by_the_servers_own(
    server: RunningServer, asked: str
) -> None:
    got = trailer_id(server, asked)
    assert got != asked and re.fullmatch(r"[0-9a-f]{16}", got)
