"""StoppingOptions.min_new_tokens over gRPC (service/worker/min_tokens.py; the HTTP API's min_tokens): no
sample ends before it has that many tokens, on Generate, GenerateStream and Decode, and a value the
call cannot honour is INVALID_ARGUMENT with reason INVALID_MIN_TOKENS naming the field."""

from __future__ import annotations

import grpc
import pytest

from proto.ladder.v1 import ladder_pb2 as pb
from tests.support.rich_errors import details_of
from tests.support.servers import RunningServer
from tests.support.sessions import part, prefill

# The served test model's greedy reply to this prompt ends with end-of-sequence as its 12th token.
ENDS_AT_12 = [31] + [2] * 8
FIELD = "stopping.min_new_tokens"


def request(ids: list[int], **stopping: object) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        prompt=pb.Prompt(tokens=pb.TokenIds(ids=ids)), stopping=pb.StoppingOptions(**stopping)
    )  # type: ignore[arg-type]


def streamed(server: RunningServer, generate: pb.GenerateRequest) -> tuple[list[int], pb.Completion]:
    events = list(server.stub.GenerateStream(generate))
    return [e.token.id for e in events if e.HasField("token")], events[-1].done


def decoded(server: RunningServer, ids: list[int], **stopping: object) -> pb.Completion:
    """A Decode on a new session holding `ids` (closed after)."""
    session_id = prefill(server, part(ids, last=True))[-1].done.session_id
    try:
        events = list(
            server.stub.Decode(
                pb.DecodeRequest(session_id=session_id, stopping=pb.StoppingOptions(**stopping))
            )
        )  # type: ignore[arg-type]
    finally:
        server.stub.CloseSession(pb.CloseSessionRequest(session_id=session_id))
    return events[-1].done


def test_a_generated_sample_does_not_end_at_end_of_sequence_before_min_new_tokens(
    server: RunningServer,
) -> None:
    free = server.stub.Generate(request(ENDS_AT_12, max_new_tokens=20))
    assert len(free.token_ids) == 12 and free.finish_reason == pb.FINISH_REASON_EOS
    held = server.stub.Generate(request(ENDS_AT_12, max_new_tokens=20, min_new_tokens=16))
    assert len(held.token_ids) >= 16
    # Masking the end changes no earlier choice: the same reply up to where it ended.
    assert list(held.token_ids[:11]) == list(free.token_ids[:11])
    assert held.token_ids[11] != free.token_ids[11]


def test_a_streamed_sample_holds_min_new_tokens_and_matches_the_unary_one(server: RunningServer) -> None:
    generate = request(ENDS_AT_12, max_new_tokens=20, min_new_tokens=16)
    tokens, done = streamed(server, generate)
    assert len(tokens) >= 16 and tokens == list(done.token_ids)
    assert tokens == list(server.stub.Generate(generate).token_ids)


def test_every_one_of_n_samples_holds_min_new_tokens(server: RunningServer) -> None:
    generate = request(ENDS_AT_12, max_new_tokens=12, min_new_tokens=12)
    generate.n, generate.sampling.temperature, generate.sampling.seed = 3, 1.0, 7
    held = server.stub.Generate(generate)
    assert [len(s.token_ids) for s in held.samples] == [12, 12, 12]
    assert all(s.finish_reason == pb.FINISH_REASON_LENGTH for s in held.samples)


def test_stop_token_ids_are_held_back_until_min_new_tokens_and_end_the_sample_after(
    server: RunningServer,
) -> None:
    free = server.stub.Generate(request(ENDS_AT_12, max_new_tokens=12, ignore_eos=True))
    stop_id = free.token_ids[1]
    early = server.stub.Generate(
        request(ENDS_AT_12, max_new_tokens=12, ignore_eos=True, stop_token_ids=[stop_id])
    )
    assert len(early.token_ids) == list(free.token_ids).index(stop_id) + 1 <= 2
    assert early.finish_reason == pb.FINISH_REASON_STOP
    held = server.stub.Generate(
        request(ENDS_AT_12, max_new_tokens=12, ignore_eos=True, stop_token_ids=[stop_id], min_new_tokens=5)
    )
    assert len(held.token_ids) >= 5 and stop_id not in held.token_ids[:5]


def test_a_stop_string_does_not_end_the_text_before_min_new_tokens(server: RunningServer) -> None:
    prompt = pb.Prompt(text="The quick brown fox")
    free = server.stub.Generate(
        pb.GenerateRequest(prompt=prompt, stopping=pb.StoppingOptions(max_new_tokens=8, ignore_eos=True))
    )
    stop = free.text[1:3]
    cut = server.stub.Generate(
        pb.GenerateRequest(
            prompt=prompt, stopping=pb.StoppingOptions(max_new_tokens=8, ignore_eos=True, stop=[stop])
        )
    )
    assert cut.text == free.text[:1]
    held = server.stub.Generate(
        pb.GenerateRequest(
            prompt=prompt,
            stopping=pb.StoppingOptions(max_new_tokens=8, ignore_eos=True, stop=[stop], min_new_tokens=8),
        )
    )
    assert held.text == free.text and held.finish_reason == pb.FINISH_REASON_LENGTH


def test_decode_holds_min_new_tokens_on_a_session(server: RunningServer) -> None:
    free = decoded(server, ENDS_AT_12, max_new_tokens=20)
    assert free.finish_reason == pb.FINISH_REASON_EOS and len(free.token_ids) == 12
    held = decoded(server, ENDS_AT_12, max_new_tokens=20, min_new_tokens=16)
    assert len(held.token_ids) >= 16
    assert list(held.token_ids[:11]) == list(free.token_ids[:11])


@pytest.mark.parametrize(
    "stopping",
    [
        {"max_new_tokens": 8, "min_new_tokens": 9},
        {"min_new_tokens": 10**6},  # over the tokens the server's default gives the call
    ],
    ids=["over-max_new_tokens", "over-the-default"],
)
def test_min_new_tokens_over_what_the_call_gets_is_invalid_argument_naming_the_field(
    server: RunningServer, stopping: dict[str, int]
) -> None:
    for call in (
        lambda: server.stub.Generate(request(ENDS_AT_12, **stopping)),
        lambda: list(server.stub.GenerateStream(request(ENDS_AT_12, **stopping))),
        lambda: decoded(server, ENDS_AT_12, **stopping),
    ):
        got = details_of(call)
        assert got.code == grpc.StatusCode.INVALID_ARGUMENT, got.message
        assert got.reason == "INVALID_MIN_TOKENS" and got.fields == [FIELD], got
