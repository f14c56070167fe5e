"""Log-probabilities through a real server: a log-softmax of the raw logits the engine produced.

The reference is the engine itself on the same model (CPU), one session alone,
appending each token: its next-token logits, log-softmaxed in numpy.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest

from engine.tokenizer import Tokenizer
from proto.ladder.v1 import ladder_pb2 as pb
from tests.support.engines import load
from tests.support.prompts import greedy_request, prompt_ids
from tests.support.servers import RunningServer

TOP = 5


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    return x - (x.max() + np.log(np.exp(x - x.max()).sum()))


def engine_logprobs(served_model: Path, prompt: list[int], generated: list[int]) -> list[np.ndarray]:
    """The log-softmax of the engine's next-token logits before each generated token."""
    engine = load(served_model)
    session = engine.open_session()
    rows = [log_softmax(engine.append(session, prompt))]
    for token in generated[:-1]:
        rows.append(log_softmax(engine.append(session, [token])))
    return rows


def asking(tokens: list[int], new: int, top: int = TOP) -> pb.GenerateRequest:
    request = greedy_request(tokens, new)
    request.logprobs.CopyFrom(pb.LogprobOptions(top=top))
    return request


def assert_matches(found: pb.TokenLogprobs | pb.Token, token: int, reference: np.ndarray) -> None:
    """The token's log-probability and the top alternatives are the reference's, largest first."""
    alternatives = found.top if isinstance(found, pb.TokenLogprobs) else found.top_logprobs
    assert found.logprob == pytest.approx(reference[token], abs=1e-4)
    order = np.argsort(-reference, kind="stable")[: len(alternatives)]
    assert [a.id for a in alternatives] == order.tolist()
    np.testing.assert_allclose([a.logprob for a in alternatives], reference[order], atol=1e-4)


def test_each_generated_tokens_logprob_is_a_log_softmax_of_the_engines_logits(
    server: RunningServer, served_model: Path
) -> None:
    tokens = prompt_ids(90, seed=3)
    reply = server.stub.Generate(asking(tokens, 6))
    reference = engine_logprobs(served_model, tokens, list(reply.token_ids))
    assert [p.id for p in reply.logprobs] == list(reply.token_ids)
    for found, token, row in zip(reply.logprobs, reply.token_ids, reference, strict=True):
        assert len(found.top) == TOP
        assert_matches(found, token, row)
        assert found.top[0].id == token  # greedy: the chosen token is the most likely


def test_alternatives_carry_each_tokens_own_text(server: RunningServer, served_model: Path) -> None:
    reply = server.stub.Generate(asking(prompt_ids(20, seed=4), 2))
    tokenizer = Tokenizer(served_model)
    for found in reply.logprobs:
        texts = [tokenizer.decode([a.id], skip_special=False) for a in found.top]
        assert [a.text for a in found.top] == texts


def test_the_stream_tags_each_token_with_the_logprobs_the_unary_call_returns(server: RunningServer) -> None:
    request = asking(prompt_ids(40, seed=5), 5, top=3)
    unary = server.stub.Generate(request)
    events = list(server.stub.GenerateStream(request))
    streamed = [e.token for e in events if e.HasField("token")]
    assert [t.logprob for t in streamed] == [p.logprob for p in unary.logprobs]
    assert [[a.id for a in t.top_logprobs] for t in streamed] == [
        [a.id for a in p.top] for p in unary.logprobs
    ]
    assert list(events[-1].done.logprobs) == list(unary.logprobs)


def test_sampled_tokens_report_the_models_distribution_not_the_filtered_one(
    server: RunningServer, served_model: Path
) -> None:
    tokens = prompt_ids(30, seed=6)
    request = asking(tokens, 4, top=0)
    request.sampling.CopyFrom(pb.SamplingOptions(temperature=0.5, top_k=3, presence_penalty=1.5, seed=9))
    reply = server.stub.Generate(request)
    reference = engine_logprobs(served_model, tokens, list(reply.token_ids))
    for found, token, row in zip(reply.logprobs, reply.token_ids, reference, strict=True):
        assert len(found.top) == 0 and found.logprob == pytest.approx(row[token], abs=1e-4)


def test_decode_returns_logprobs_of_the_sessions_next_tokens(
    server: RunningServer, served_model: Path
) -> None:
    tokens = prompt_ids(25, seed=7)
    prefill = pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=tokens)))
    session = list(server.stub.Prefill(iter([prefill])))[-1].done.session_id
    stopping = pb.StoppingOptions(max_new_tokens=4, ignore_eos=True)
    decode = pb.DecodeRequest(session_id=session, stopping=stopping, logprobs=pb.LogprobOptions(top=2))
    events = list(server.stub.Decode(decode))
    server.stub.CloseSession(pb.CloseSessionRequest(session_id=session))
    streamed = [e.token for e in events if e.HasField("token")]
    reference = engine_logprobs(served_model, tokens, [t.id for t in streamed])
    for token, row in zip(streamed, reference, strict=True):
        assert_matches(token, token.id, row)
    assert [p.logprob for p in events[-1].done.logprobs] == [t.logprob for t in streamed]


def test_without_logprob_options_no_logprobs_are_returned(server: RunningServer) -> None:
    request = greedy_request(prompt_ids(10), 3)
    events = list(server.stub.GenerateStream(request))
    assert not any(e.token.HasField("logprob") or e.token.top_logprobs for e in events if e.HasField("token"))
    assert not events[-1].done.logprobs and not server.stub.Generate(request).logprobs


def open_session(server: RunningServer) -> str:
    prefill = pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=[5, 6, 7])))
    return str(list(server.stub.Prefill(iter([prefill])))[-1].done.session_id)


def decode_refusal(server: RunningServer, options: pb.LogprobOptions) -> grpc.RpcError:
    session = open_session(server)
    try:
        with pytest.raises(grpc.RpcError) as caught:
            list(server.stub.Decode(pb.DecodeRequest(session_id=session, logprobs=options)))
    finally:
        server.stub.CloseSession(pb.CloseSessionRequest(session_id=session))
    return caught.value


@pytest.mark.parametrize("call", ["Generate", "GenerateStream"])
def test_more_than_twenty_alternatives_are_invalid_argument(server: RunningServer, call: str) -> None:
    request = greedy_request([5, 6], 2)
    request.logprobs.CopyFrom(pb.LogprobOptions(top=21))
    calls = {
        "Generate": lambda: server.stub.Generate(request),
        "GenerateStream": lambda: list(server.stub.GenerateStream(request)),
    }
    with pytest.raises(grpc.RpcError) as caught:
        calls[call]()
    refused = caught.value
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT and "logprobs.top" in refused.details()
    error = decode_refusal(server, pb.LogprobOptions(top=21))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "logprobs.top" in error.details()


def test_decode_refuses_prompt_logprobs(server: RunningServer) -> None:
    assert decode_refusal(server, pb.LogprobOptions(prompt=True)).code() == grpc.StatusCode.INVALID_ARGUMENT


def prompt_reference(served_model: Path, prompt: list[int]) -> list[np.ndarray]:
    """Row i: the log-softmax of the engine's logits after prompt[:i + 1], one token per forward."""
    engine = load(served_model)
    session = engine.open_session()
    return [log_softmax(engine.append(session, [token])) for token in prompt[:-1]]


@pytest.mark.parametrize("length", [1, 2, 70, 151])
def test_prompt_logprobs_come_from_the_real_rows_of_the_prefill_never_a_padded_one(
    server: RunningServer, served_model: Path, length: int
) -> None:
    tokens = prompt_ids(length, seed=length)
    request = asking(tokens, 1, top=3)
    request.logprobs.prompt = True
    reply = server.stub.Generate(request)
    if length > 2:
        assert reply.prefill.padded_rows > 0, "the prompt should end in a padded forward"
    assert [p.id for p in reply.prompt_logprobs] == tokens[1:]
    for found, token, row in zip(
        reply.prompt_logprobs, tokens[1:], prompt_reference(served_model, tokens), strict=True
    ):
        assert_matches(found, token, row)


def test_the_stream_and_the_unary_call_return_the_same_prompt_logprobs(server: RunningServer) -> None:
    request = asking(prompt_ids(45, seed=8), 2, top=1)
    request.logprobs.prompt = True
    unary = server.stub.Generate(request)
    done = list(server.stub.GenerateStream(request))[-1].done
    assert len(unary.prompt_logprobs) == 44 and list(done.prompt_logprobs) == list(unary.prompt_logprobs)


def test_prompt_logprobs_prefill_the_whole_prompt_even_when_a_prefix_is_held(server: RunningServer) -> None:
    tokens = prompt_ids(200, seed=9)
    held = server.stub.Generate(greedy_request(tokens, 1))  # leaves the prompt's KV held for sharing
    again = server.stub.Generate(greedy_request(tokens, 1))
    request = asking(tokens, 1, top=0)
    request.logprobs.prompt = True
    scored = server.stub.Generate(request)
    assert held.prefill.shared_rows == 0 < again.prefill.shared_rows
    assert scored.prefill.shared_rows == 0 and scored.prefill.real_rows == len(tokens)
    assert len(scored.prompt_logprobs) == len(tokens) - 1
