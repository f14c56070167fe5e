"""n samples per request through a real server: one prefill, n rows decoded side by side.

Sample i draws from seed + i, so each sample is exactly the single-sample request
with that seed, alone or beside other requests in the same decode forwards.
"""

from __future__ import annotations

import grpc
import pytest

from proto.ladder.v1 import ladder_pb2 as pb
from tests.support.prompts import greedy_request, prompt_ids
from tests.support.rich_errors import status_details
from tests.support.servers import RunningServer
from tests.support.waiting import wait_for

NEW = 6


def sampled(tokens: list[int], n: int = 1, seed: int = 7, new: int = NEW) -> pb.GenerateRequest:
    request = greedy_request(tokens, new)
    request.sampling.CopyFrom(pb.SamplingOptions(temperature=1.5, seed=seed))
    request.n = n
    return request


def test_each_sample_is_the_single_request_with_the_next_seed(server: RunningServer) -> None:
    tokens = prompt_ids(60, seed=11)
    reply = server.stub.Generate(sampled(tokens, n=3))
    assert [s.index for s in reply.samples] == [0, 1, 2]
    alone = [list(server.stub.Generate(sampled(tokens, seed=7 + i)).token_ids) for i in range(3)]
    assert [list(s.token_ids) for s in reply.samples] == alone
    assert list(reply.token_ids) == alone[0] and reply.text == reply.samples[0].text
    assert len({tuple(a) for a in alone}) > 1, "three seeds at temperature 1.5 should not all agree"
    assert reply.usage.completion_tokens == 3 * NEW


def test_n_samples_share_one_prefill_and_decode_in_the_same_forwards(server: RunningServer) -> None:
    tokens = prompt_ids(150, seed=12)
    single = server.stub.Generate(sampled(prompt_ids(150, seed=112), n=1))  # a prompt nothing shares with
    before = server.stats()
    reply = server.stub.Generate(sampled(tokens, n=4))
    after = server.stats()
    assert reply.prefill == single.prefill  # the same forwards at the same widths: one prefill
    assert reply.prefill.real_rows == len(tokens) and reply.prefill.shared_rows == 0
    assert after.prompt_tokens - before.prompt_tokens == len(tokens)
    # The first token comes from the prefill's logits; each later one is one forward for all four rows.
    assert after.decode.steps - before.decode.steps == NEW - 1
    assert after.decode.rows - before.decode.rows == 4 * (NEW - 1)
    assert after.sessions_open == 0


def test_the_stream_tags_each_token_with_its_sample(server: RunningServer) -> None:
    tokens = prompt_ids(30, seed=13)
    events = list(server.stub.GenerateStream(sampled(tokens, n=3)))
    done = events[-1].done
    for sample in range(3):
        mine = [e.token for e in events if e.HasField("token") and e.token.sample == sample]
        assert [t.index for t in mine] == list(range(NEW))
        assert [t.id for t in mine] == list(done.samples[sample].token_ids)
    assert sum(1 for e in events if e.HasField("done")) == 1


def test_greedy_samples_are_all_the_greedy_completion(server: RunningServer) -> None:
    tokens = prompt_ids(40, seed=14)
    request = greedy_request(tokens, NEW)
    request.n = 3
    request.logprobs.CopyFrom(pb.LogprobOptions(top=2))
    reply = server.stub.Generate(request)
    greedy = server.stub.Generate(greedy_request(tokens, NEW))
    assert all(list(s.token_ids) == list(greedy.token_ids) for s in reply.samples)
    assert all(s.finish_reason == pb.FINISH_REASON_LENGTH for s in reply.samples)
    assert [list(s.logprobs) for s in reply.samples[1:]] == [list(reply.samples[0].logprobs)] * 2


def test_seeded_sampling_gives_the_same_tokens_alone_and_batched(server: RunningServer) -> None:
    tokens = prompt_ids(50, seed=15)
    request = sampled(tokens, seed=21, new=24)
    alone = list(server.stub.Generate(request).token_ids)
    before = server.stats().decode
    # Five long streams are decoding (each has sent its first token) while the request runs.
    crowd = [
        server.stub.GenerateStream(sampled(prompt_ids(20 + 10 * i, seed=i), seed=i, new=250))
        for i in range(5)
    ]
    for stream in crowd:
        assert next(stream).HasField("token")
    batched = list(server.stub.Generate(request).token_ids)
    for stream in crowd:
        list(stream)
    assert batched == alone
    after = server.stats().decode
    assert after.steps - before.steps < after.rows - before.rows, "the requests never shared a forward"


@pytest.mark.parametrize("n", [2**32 - 1, 129])
def test_more_samples_than_the_limit_are_out_of_range(server: RunningServer, n: int) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        server.stub.Generate(sampled([5, 6, 7], n=n))
    details = status_details(caught.value)
    assert (details.code, details.reason, details.fields) == (
        grpc.StatusCode.OUT_OF_RANGE,
        "TOO_MANY_SAMPLES",
        ["n"],
    )


def test_more_samples_than_slots_start_as_slots_free_each_the_single_request_with_its_seed(
    server: RunningServer,
) -> None:
    # The server has 12 slots: 40 samples run at most 12 at once, the prompt's holder among them,
    # each exactly the one-sample request with seed 7 + i, and every slot comes back.
    tokens = prompt_ids(30, seed=18)
    before = server.stats()
    reply = server.stub.Generate(sampled(tokens, n=40))
    after = server.stats()
    assert [s.index for s in reply.samples] == list(range(40))
    alone = [list(server.stub.Generate(sampled(tokens, seed=7 + i)).token_ids) for i in range(40)]
    assert [list(s.token_ids) for s in reply.samples] == alone
    assert reply.usage.completion_tokens == 40 * NEW
    assert after.prompt_tokens - before.prompt_tokens == len(tokens), "the prompt ran once for all 40"
    assert after.sessions_open == 0


def test_a_cancelled_stream_of_n_samples_returns_every_slot(server: RunningServer) -> None:
    stream = server.stub.GenerateStream(sampled(prompt_ids(30, seed=16), n=4, new=200))
    assert next(stream).HasField("token")
    stream.cancel()
    wait_for(lambda: server.stats().sessions_open == 0)
    assert len(server.stub.Generate(sampled([5, 6, 7], n=11)).samples) == 11


def test_samples_of_a_prompt_whose_prefix_is_held_are_the_samples_of_a_full_prefill(
    server: RunningServer,
) -> None:
    tokens = prompt_ids(200, seed=17)
    first = server.stub.Generate(sampled(tokens, n=3))
    second = server.stub.Generate(sampled(tokens, n=3))
    assert first.prefill.shared_rows == 0 < second.prefill.shared_rows
    assert [list(s.token_ids) for s in second.samples] == [list(s.token_ids) for s in first.samples]


def test_a_stop_string_spanning_two_tokens_ends_each_sample_where_its_own_text_has_it(
    server: RunningServer,
) -> None:
    def request(stop: list[str]) -> pb.GenerateRequest:
        return pb.GenerateRequest(
            prompt=pb.Prompt(text="Once upon a time"),
            stopping=pb.StoppingOptions(max_new_tokens=24, ignore_eos=True, stop=stop),
            sampling=pb.SamplingOptions(temperature=1.0, seed=3),
            n=4,
        )

    pieces: list[list[str]] = [[] for _ in range(4)]
    for event in server.stub.GenerateStream(request([])):
        if event.HasField("token"):
            pieces[event.token.sample].append(event.token.text)
    free = [sample.text for sample in server.stub.Generate(request([])).samples]  # tails flushed
    # A stop made of the end of one of sample 0's tokens and the start of the next: no token holds it.
    k = next(i for i in range(4, 20) if pieces[0][i].strip() and pieces[0][i + 1].strip())
    stop = pieces[0][k][-2:] + pieces[0][k + 1][:2]
    assert not any(stop in piece for piece in pieces[0])
    stopped = server.stub.Generate(request([stop]))
    for sample, text in zip(stopped.samples, free, strict=True):
        at = text.find(stop)
        assert sample.text == (text[:at] if at >= 0 else text), sample.index
        expected = pb.FINISH_REASON_STOP if at >= 0 else pb.FINISH_REASON_LENGTH
        assert sample.finish_reason == expected
    assert stopped.samples[0].finish_reason == pb.FINISH_REASON_STOP
    assert server.stats().sessions_open == 0
