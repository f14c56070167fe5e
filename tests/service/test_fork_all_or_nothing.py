"""ForkSession is all or nothing, as Prefill is: a fork whose call the server saw end without its
answer (the deadline passed, the client went away) leaves no session behind and gives the caller's
share back. A client-side cancel that races an answer already sent cannot be undone by the server
(the call ended OK there), so it is not asserted here."""

from __future__ import annotations

import subprocess
import sys
import time

import grpc

from proto.ladder.v1 import ladder_pb2 as pb
from tests.support.prompts import prompt_ids
from tests.support.servers import RunningServer
from tests.support.sessions import part, prefill
from tests.support.waiting import wait_for

KILLED_CLIENT = """
import sys, grpc
from proto.ladder.v1 import ladder_pb2 as pb, ladder_pb2_grpc
stub = ladder_pb2_grpc.LadderStub(grpc.insecure_channel(sys.argv[1]))
stub.ForkSession(pb.ForkSessionRequest(session_id=sys.argv[2]))
"""


def test_forks_whose_answers_were_not_taken_leave_no_session(server: RunningServer) -> None:
    baseline = server.stats().sessions_open
    source = prefill(server, part(prompt_ids(300, seed=5), last=True))[-1].done.session_id
    for _ in range(3):  # the deadline passes while the server's event loop is held: the fork runs after it
        with server.paused():
            late = server.stub.ForkSession.future(pb.ForkSessionRequest(session_id=source), timeout=0.3)
            assert late.exception(timeout=30).code() == grpc.StatusCode.DEADLINE_EXCEEDED
    for _ in range(2):  # a client killed while its fork waits for the worker
        with server.frozen():
            client = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, server.address, source])
            time.sleep(1.0)  # time for the call to arrive; not asserted (it fails safe: no fork to leak)
            client.kill()
            client.wait()
    wait_for(lambda: server.stats().sessions_open == baseline + 1, what="every untaken fork closed")
    server.stub.CloseSession(pb.CloseSessionRequest(session_id=source))
