"""Numbers out of range and requests that would cost unbounded work are refused before any work.

Sampling: temperature in [0, 100], top_k in [0, 2^20], top_p in (0, 1],
repetition_penalty in [1e-3, 1e3], NaN and infinities nowhere: INVALID_ARGUMENT.
Stopping: at most 16 stop strings of at most 512 characters: INVALID_ARGUMENT.
Text and chat prompts: at most 32 UTF-8 bytes per allowed prompt token, measured
before tokenizing: OUT_OF_RANGE. Inside those bounds the sampler always returns
a token and stop strings cost time linear in their length.
"""

from __future__ import annotations

import random

import grpc
import numpy as np
import pytest

from engine.sampling import Sampler, SamplingParams
from proto.ladder.v1 import ladder_pb2 as pb
from service.front.stop_text import StopText
from tests.support.prompts import greedy_request
from tests.support.servers import RunningServer

Code = grpc.StatusCode
NAN, INF = float("nan"), float("inf")


def status(server: RunningServer, request: pb.GenerateRequest) -> Code:
    """The status of Generate and GenerateStream (the same for both) for `request`."""
    codes = []
    for call in (server.stub.Generate, lambda r: list(server.stub.GenerateStream(r))):
        try:
            call(request)
            codes.append(Code.OK)
        except grpc.RpcError as error:
            codes.append(error.code())
    assert codes[0] == codes[1]
    return codes[0]


def sampled(**values: float) -> pb.GenerateRequest:
    request = greedy_request([5, 6, 7], 3)
    request.sampling.CopyFrom(pb.SamplingOptions(**values))  # type: ignore[arg-type]
    return request


OUT_OF_RANGE_SAMPLING = {
    "NaN temperature": {"temperature": NAN},
    "infinite temperature": {"temperature": INF},
    "temperature over 100": {"temperature": 100.5},
    "top_k over 2^20": {"top_k": 2**20 + 1},
    "NaN top_p": {"top_p": NAN},
    "negative top_p": {"top_p": -0.5},
    "a repetition penalty of 1e-38": {"temperature": 1.0, "repetition_penalty": 1e-38},
    "a repetition penalty of 1e-4": {"repetition_penalty": 1e-4},
    "a repetition penalty of 1e4": {"temperature": 0.7, "repetition_penalty": 1e4},
    "an infinite repetition penalty": {"repetition_penalty": INF},
    "a NaN repetition penalty": {"temperature": 1.0, "repetition_penalty": NAN},
    "min_p over 1": {"temperature": 1.0, "min_p": 1.5},
    "a negative min_p": {"min_p": -0.1},
    "a NaN min_p": {"temperature": 1.0, "min_p": NAN},
    "a presence penalty over 2": {"presence_penalty": 2.5},
    "a frequency penalty under -2": {"temperature": 1.0, "frequency_penalty": -3.0},
    "an infinite frequency penalty": {"frequency_penalty": INF},
}


@pytest.mark.parametrize("case", sorted(OUT_OF_RANGE_SAMPLING))
def test_sampling_values_out_of_range_are_invalid_argument_on_every_rpc_that_samples(
    server: RunningServer, case: str
) -> None:
    options = pb.SamplingOptions(**OUT_OF_RANGE_SAMPLING[case])  # type: ignore[arg-type]
    assert status(server, sampled(**OUT_OF_RANGE_SAMPLING[case])) == Code.INVALID_ARGUMENT
    prefill = pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=[5, 6])), sampling=options)
    with pytest.raises(grpc.RpcError) as caught:
        list(server.stub.Prefill(iter([prefill])))
    assert caught.value.code() == Code.INVALID_ARGUMENT
    opened = list(server.stub.Prefill(iter([pb.PrefillRequest(prompt=prefill.prompt)])))[-1].done.session_id
    with pytest.raises(grpc.RpcError) as caught:
        list(server.stub.Decode(pb.DecodeRequest(session_id=opened, sampling=options)))
    assert caught.value.code() == Code.INVALID_ARGUMENT
    server.stub.CloseSession(pb.CloseSessionRequest(session_id=opened))
    assert server.stats().sessions_open == 0


@pytest.mark.parametrize(
    "values",
    [
        {"temperature": 100.0, "seed": 1},
        {"temperature": 1.0, "repetition_penalty": 1e-3, "seed": 2},
        {"temperature": 1.0, "repetition_penalty": 1e3, "seed": 3},
        {"temperature": 1.0, "top_k": 2**20},
        {"temperature": 1.0, "top_p": 1e-45, "seed": 2**64 - 1},
        {"temperature": 1e-45, "seed": 0},
        {"temperature": 1.0, "min_p": 1.0, "seed": 4},
        {"temperature": 1.0, "min_p": 1e-45, "seed": 5},
        {"presence_penalty": 2.0, "frequency_penalty": -2.0},
        {"temperature": 1.0, "frequency_penalty": 2.0, "presence_penalty": -2.0, "seed": 6},
    ],
    ids=str,
)
def test_sampling_values_at_the_edges_of_their_ranges_generate(
    server: RunningServer, values: dict[str, float]
) -> None:
    assert len(server.stub.Generate(sampled(**values)).token_ids) == 3


def test_the_sampler_returns_a_token_for_in_range_settings_whatever_the_logits() -> None:
    big = np.finfo(np.float32).max
    rows = [
        np.array([big, big, 1.0, -big], np.float32),
        np.array([NAN, 1.0, -INF], np.float32),
        np.array([-INF, -INF], np.float32),
        np.array([NAN, NAN], np.float32),
        np.array([INF, 3.0], np.float32),
        np.array([1e-30, 0.0, -1e-30], np.float32),
    ]
    settings = [
        SamplingParams(temperature=t, top_k=k, top_p=p, repetition_penalty=r, seed=1)
        for t in (1e-45, 0.7, 100.0)
        for k in (0, 1, 2)
        for p in (1e-45, 0.9, 1.0)
        for r in (1e-3, 1e3)
    ]
    for params in settings:
        for logits in rows:
            token = Sampler(params)(logits, history=[0, 1])
            assert 0 <= token < logits.size
            drew_nan = np.isnan(logits[token]) and not np.isnan(logits).all()
            assert params.greedy or not drew_nan  # greedy is a plain argmax, as on the device


def stopping_status(server: RunningServer, stops: list[str]) -> Code:
    return status(server, greedy_request([5, 6, 7], 4, stop=stops))


def test_at_most_16_stop_strings_of_at_most_512_characters_are_accepted(server: RunningServer) -> None:
    assert stopping_status(server, ["é" * 512] * 16) == Code.OK
    assert stopping_status(server, ["x"] * 17) == Code.INVALID_ARGUMENT
    assert stopping_status(server, ["x" * 513]) == Code.INVALID_ARGUMENT
    opened = list(
        server.stub.Prefill(iter([pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=[5, 6])))]))
    )[-1].done.session_id
    with pytest.raises(grpc.RpcError) as caught:
        list(
            server.stub.Decode(
                pb.DecodeRequest(
                    session_id=opened, stopping=pb.StoppingOptions(max_new_tokens=2, stop=["y" * 600])
                )
            )
        )
    assert caught.value.code() == Code.INVALID_ARGUMENT
    server.stub.CloseSession(pb.CloseSessionRequest(session_id=opened))


def held_back_by_definition(text: str, stops: list[str]) -> int:
    """The longest tail of `text` that is a proper prefix of some stop string."""
    return max((n for s in stops if s for n in range(1, len(s)) if text.endswith(s[:n])), default=0)


def test_stop_text_holds_back_exactly_the_longest_tail_that_could_begin_a_stop() -> None:
    rng = random.Random(7)
    for _ in range(3000):
        stops = [
            "".join(rng.choice("ab") for _ in range(rng.randint(0, 6))) for _ in range(rng.randint(1, 3))
        ]
        stop_text = StopText(stops)
        for _ in range(rng.randint(1, 10)):
            piece = "".join(rng.choice("abc") for _ in range(rng.randint(0, 4)))
            before = stop_text.held + piece
            out = stop_text.push(piece)
            if stop_text.stopped:
                assert any(s and s in before for s in stops) and stop_text.held == ""
                break
            assert len(stop_text.held) == held_back_by_definition(before, stops)
            assert before == out + stop_text.held


def test_text_and_chat_prompts_over_32_bytes_per_prompt_token_are_out_of_range_before_tokenizing(
    server: RunningServer,
) -> None:
    limit = 1024 * 32  # the KV capacity is the prompt limit here
    two_byte_text = pb.Prompt(text="é" * (limit // 2 + 1))  # fewer characters than the limit, more bytes
    assert status(server, pb.GenerateRequest(prompt=two_byte_text)) == Code.OUT_OF_RANGE
    chat = pb.Chat(messages=[pb.ChatMessage(role="user", content="x" * limit)])
    assert status(server, pb.GenerateRequest(prompt=pb.Prompt(chat=chat))) == Code.OUT_OF_RANGE
    with pytest.raises(grpc.RpcError) as caught:
        server.stub.Tokenize(pb.TokenizeRequest(text="y" * (limit + 1)))
    assert caught.value.code() == Code.OUT_OF_RANGE and "bytes" in caught.value.details()
    assert len(server.stub.Tokenize(pb.TokenizeRequest(text="The capital of France is")).ids) > 0
