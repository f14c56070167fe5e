"""Messages over --max-message-bytes, both ways: a request over it is refused with
MESSAGE_TOO_LARGE (no RetryInfo: the same request fails again), logged and counted; a request
whose answer cannot fit is refused before any work (RESPONSE_TOO_LARGE), and one whose answer
turns out too large fails with our status, not gRPC's, counted as failed, its work counted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from proto.ladder.v1 import ladder_pb2 as pb
from service.calls import LogprobRequest, least_response_bytes
from tests.service.test_metrics import Endpoint
from tests.support.prompts import greedy_request, prompt_ids
from tests.support.rich_errors import Details, status_details
from tests.support.servers import FRONTENDS, FRONTENDS_IDS, RunningServer, server_config

LIMIT = 16 * 1024


@pytest.fixture(params=FRONTENDS, ids=FRONTENDS_IDS)
def served(served_model: Path, request: pytest.FixtureRequest) -> Iterator[Endpoint]:
    running = RunningServer(
        server_config(
            served_model,
            max_message_bytes=LIMIT,
            max_sessions=8,
            max_new_tokens=1000,
            frontends=request.param,
        )
    )
    try:
        yield Endpoint(running)
    finally:
        running.close()


def details(error: grpc.RpcError) -> tuple[Details, bool]:
    """The status details of a failed call, and whether they carry a RetryInfo."""
    got = status_details(error)
    return got, got.retry_seconds is not None


def test_the_least_response_size_grows_with_every_field_that_adds_to_the_answer() -> None:
    base = least_response_bytes(100, 1, None)
    assert least_response_bytes(100, 2, None) > base
    assert least_response_bytes(200, 1, None) > base
    scored = least_response_bytes(100, 1, LogprobRequest())
    assert least_response_bytes(100, 1, LogprobRequest(top=5)) > scored > base
    assert least_response_bytes(100, 1, LogprobRequest(prompt=True), prompt=50) > least_response_bytes(
        100, 1, LogprobRequest()
    )


def test_a_request_over_the_limit_is_refused_with_its_reason_logged_and_counted(served: Endpoint) -> None:
    stub = served.running.stub
    with pytest.raises(grpc.RpcError) as caught:
        stub.Generate(greedy_request([300] * (LIMIT // 2 + 100), 2))  # two bytes a token id
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    info, retry = details(caught.value)
    assert info.reason == "MESSAGE_TOO_LARGE" and info.metadata["limit_bytes"] == str(LIMIT)
    assert not retry, "the same request would fail again"
    assert f"limit of {LIMIT} bytes" in caught.value.details()
    m = served.scrape()
    assert m("ladder_calls_total", protocol="grpc", method="Generate", code="INVALID_ARGUMENT") == 1
    assert len(stub.Generate(greedy_request([5, 6], 2)).token_ids) == 2, "the server serves on"


def test_a_prefill_part_over_the_limit_is_refused_and_the_session_is_not_left_open(served: Endpoint) -> None:
    stub = served.running.stub
    parts = [
        pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=[5, 6, 7]))),
        pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=[300] * (LIMIT // 2 + 100)))),
    ]
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Prefill(iter(parts)))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert details(caught.value)[0].reason == "MESSAGE_TOO_LARGE"
    assert served.running.stats().sessions_open == 0


@pytest.mark.parametrize("method", ["Generate", "GenerateStream"])
def test_a_request_whose_answer_cannot_fit_is_refused_before_any_work(served: Endpoint, method: str) -> None:
    request = greedy_request(prompt_ids(20, seed=1), 200)
    request.n, request.sampling.temperature = 4, 1.0
    request.logprobs.top = 5  # at least 4 x 200 x (1 + 6 x 9) bytes: over 16 KiB
    call = getattr(served.running.stub, method)
    with pytest.raises(grpc.RpcError) as caught:
        reply = call(request)
        if method == "GenerateStream":
            list(reply)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    info, retry = details(caught.value)
    assert info.reason == "RESPONSE_TOO_LARGE" and not retry
    assert "n = 4" in caught.value.details() and "max_new_tokens = 200" in caught.value.details()
    m = served.scrape()
    assert m("ladder_prefill_forwards_total") == 0 and m("ladder_generated_tokens_total") == 0
    assert m("ladder_calls_total", protocol="grpc", method=method, code="INVALID_ARGUMENT") == 1


def test_an_answer_that_turns_out_too_large_fails_with_its_reason_and_counts_its_work(
    served: Endpoint,
) -> None:
    # The alternatives' ids and text take more than the smallest-size bound counts for them:
    # 420 tokens with 2 alternatives each pass the bound and make a larger answer.
    request = pb.GenerateRequest(
        prompt=pb.Prompt(text="hello"), stopping=pb.StoppingOptions(max_new_tokens=420, ignore_eos=True)
    )
    request.logprobs.top = 2
    assert least_response_bytes(420, 1, LogprobRequest(top=2)) < LIMIT
    with pytest.raises(grpc.RpcError) as caught:
        served.running.stub.Generate(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert details(caught.value)[0].reason == "RESPONSE_TOO_LARGE"
    m = served.scrape()
    assert m("ladder_calls_total", protocol="grpc", method="Generate", code="INVALID_ARGUMENT") == 1
    assert m.get("ladder_calls_total", protocol="grpc", method="Generate", code="OK") is None
    assert m("ladder_generated_tokens_total") == 420


def test_a_decode_that_names_no_length_is_checked_at_the_length_the_server_gives_it(
    served_model: Path,
) -> None:
    # --default-max-new-tokens 0: as many as fit, up to --max-new-tokens (1,000 here), the length
    # Decode then runs to; its answer at that length cannot fit in 16 KiB with 5 alternatives.
    config = server_config(
        served_model, max_message_bytes=LIMIT, max_new_tokens=1000, default_max_new_tokens=0
    )
    with RunningServer(config) as running:
        done = list(
            running.stub.Prefill(
                iter(
                    [
                        pb.PrefillRequest(
                            prompt=pb.Prompt(tokens=pb.TokenIds(ids=prompt_ids(20, seed=2))), last=True
                        )
                    ]
                )
            )
        )[-1].done
        with pytest.raises(grpc.RpcError) as caught:
            list(
                running.stub.Decode(
                    pb.DecodeRequest(session_id=done.session_id, logprobs=pb.LogprobOptions(top=5))
                )
            )
        assert details(caught.value)[0].reason == "RESPONSE_TOO_LARGE"
        assert "max_new_tokens = 1000" in caught.value.details()
