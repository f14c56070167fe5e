"""A request is converted whole at the door into one typed call, and refused there when malformed."""

from __future__ import annotations

import dataclasses

import pytest

from engine.chat_messages import ChatMessage
from engine.errors import InvalidInput
from proto.ladder.v1 import ladder_pb2 as pb
from service.grpc import wire


def test_a_generate_request_becomes_one_frozen_call_holding_what_was_sent() -> None:
    request = pb.GenerateRequest(
        prompt=pb.Prompt(chat=pb.Chat(messages=[pb.ChatMessage(role="user", content="Hi")])),
        stopping=pb.StoppingOptions(max_new_tokens=7, stop=["\n"], stop_token_ids=[3]),
        sampling=pb.SamplingOptions(temperature=0.5, seed=9),
        n=2,
        logprobs=pb.LogprobOptions(top=3, prompt=True),
    )
    call = wire.generate_call(request)
    assert call.prompt.chat == (ChatMessage("user", "Hi"),) and call.prompt.text is None
    assert (call.stopping.max_new_tokens, call.stopping.stop, call.stopping.stop_token_ids) == (
        7,
        ("\n",),
        frozenset({3}),
    )
    assert (call.sampling.temperature, call.sampling.seed, call.n, call.prompt_top) == (0.5, 9, 2, 3)
    assert [s.params.seed for s in call.samplers()] == [9, 10]
    with pytest.raises(dataclasses.FrozenInstanceError):
        call.n = 3  # type: ignore[misc]


def test_a_request_without_a_prompt_or_n_becomes_empty_ids_and_one_sample() -> None:
    call = wire.generate_call(pb.GenerateRequest())
    assert call.prompt.ids == () and call.n == 1 and call.prompt_top is None


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (
            lambda: wire.generate_call(pb.GenerateRequest(sampling=pb.SamplingOptions(top_p=2.0))),
            "sampling.top_p",
        ),
        (
            lambda: wire.generate_call(pb.GenerateRequest(stopping=pb.StoppingOptions(stop=["x"] * 17))),
            "stopping.stop",
        ),
        (lambda: wire.generate_call(pb.GenerateRequest(logprobs=pb.LogprobOptions(top=21))), "logprobs.top"),
        (
            lambda: wire.decode_call(pb.DecodeRequest(logprobs=pb.LogprobOptions(prompt=True))),
            "logprobs.prompt",
        ),
        (
            lambda: wire.decode_call(pb.DecodeRequest(sampling=pb.SamplingOptions(temperature=-1))),
            "sampling.temperature",
        ),
        (
            lambda: wire.prefill_call(pb.PrefillRequest(sampling=pb.SamplingOptions(min_p=2))),
            "sampling.min_p",
        ),
        (lambda: wire.prefill_part(pb.PrefillRequest(session_id="a.b")), "session_id"),
        (lambda: wire.tokenize_prompt(pb.TokenizeRequest()), "text"),
    ],
)
def test_a_malformed_request_is_refused_as_its_call_is_built_naming_the_field(
    build: object, field: str
) -> None:
    with pytest.raises(InvalidInput) as refused:
        build()  # type: ignore[operator]
    assert refused.value.field == field and refused.value.reason
