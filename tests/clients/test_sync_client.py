"""The blocking client against a real server: generate, stream, prefill + decode, rewind, stats, errors."""

from __future__ import annotations

import grpc
import pytest

from clients.python import LadderClient, Logprobs, Sampling, Stopping, completion_of, fork_session_id
from proto.ladder.v1 import ladder_pb2 as pb
from tests.support.prompts import PROMPT_IDS, greedy_stopping


def test_generate_returns_the_requested_number_of_tokens_with_usage_and_plan(client: LadderClient) -> None:
    completion = client.generate(PROMPT_IDS, stopping=greedy_stopping(8))
    assert len(completion.token_ids) == 8
    assert completion.usage.prompt_tokens == len(PROMPT_IDS)
    assert completion.usage.completion_tokens == 8
    assert completion.finish_reason == pb.FINISH_REASON_LENGTH
    # Prefilled, or copied from the prefix an earlier call with this prompt left (all but its last two).
    prefill = completion.prefill
    assert prefill.real_rows + prefill.shared_rows == len(PROMPT_IDS) and prefill.real_rows >= 2
    assert prefill.forwards == len(prefill.widths) == -(-prefill.real_rows // 64)
    assert completion.timing.ttft_ms > 0


def test_streamed_tokens_are_the_tokens_of_the_final_completion(client: LadderClient) -> None:
    events = list(client.generate_stream("hello ladder", stopping=greedy_stopping(10)))
    tokens = [e.token for e in events if e.WhichOneof("event") == "token"]
    done = completion_of(events)
    assert [t.id for t in tokens] == list(done.token_ids)
    assert [t.index for t in tokens] == list(range(10))
    assert done.text.startswith("".join(t.text for t in tokens))


def test_stream_and_unary_generate_agree_under_greedy_sampling(client: LadderClient) -> None:
    unary = client.generate("the same prompt", stopping=greedy_stopping(12))
    streamed = completion_of(client.generate_stream("the same prompt", stopping=greedy_stopping(12)))
    assert list(unary.token_ids) == list(streamed.token_ids)
    assert unary.text == streamed.text


def test_prefill_in_two_parts_then_decode_equals_one_generate(client: LadderClient) -> None:
    forwards, done = client.prefill([PROMPT_IDS[:40], PROMPT_IDS[40:]])
    try:
        # Prefilled, but for what an earlier call with this prompt left held (prefix sharing).
        assert sum(f.real_rows for f in forwards) + done.summary.shared_rows == len(PROMPT_IDS) == done.length
        assert all(f.width >= f.real_rows for f in forwards)
        decoded = completion_of(client.decode(done.session_id, 12, stopping=greedy_stopping(12)))
        generated = client.generate(PROMPT_IDS, stopping=greedy_stopping(12))
        assert list(decoded.token_ids) == list(generated.token_ids)
        assert done.next_token == generated.token_ids[0]
        assert decoded.session_id == done.session_id
    finally:
        client.close_session(done.session_id)


def test_rewind_then_decode_reproduces_the_earlier_continuation(client: LadderClient) -> None:
    _, done = client.prefill([PROMPT_IDS])
    try:
        first = completion_of(client.decode(done.session_id, 6, stopping=greedy_stopping(6)))
        assert client.rewind(done.session_id, len(PROMPT_IDS)).length == len(PROMPT_IDS)
        again = completion_of(client.decode(done.session_id, 6, stopping=greedy_stopping(6)))
        assert list(again.token_ids) == list(first.token_ids)
    finally:
        client.close_session(done.session_id)


def test_a_forked_session_continues_like_its_source(client: LadderClient) -> None:
    _, done = client.prefill([PROMPT_IDS])
    fork = client.fork_session(done.session_id)
    shorter = client.fork_session(done.session_id, 40)
    try:
        assert (fork.length, shorter.length) == (len(PROMPT_IDS), 40)
        source = completion_of(client.decode(done.session_id, 6, stopping=greedy_stopping(6)))
        forked = completion_of(client.decode(fork.session_id, 6, stopping=greedy_stopping(6)))
        assert list(forked.token_ids) == list(source.token_ids)
    finally:
        for session_id in (done.session_id, fork.session_id, shorter.session_id):
            client.close_session(session_id)


def test_a_named_fork_has_the_id_the_client_computes_and_a_retry_answers_it(client: LadderClient) -> None:
    _, done = client.prefill([PROMPT_IDS])
    fork = client.fork_session(done.session_id, 40, fork_id="retry-me")
    try:
        assert fork.session_id == fork_session_id(done.session_id, "retry-me")
        assert client.fork_session(done.session_id, 40, fork_id="retry-me") == pb.ForkSessionResponse(
            session_id=fork.session_id, length=40, source_session_id=done.session_id
        )
    finally:
        for session_id in (done.session_id, fork.session_id):
            client.close_session(session_id)


def test_stats_count_a_session_while_it_is_open_and_not_after_close(client: LadderClient) -> None:
    before = client.engine_stats()
    _, done = client.prefill([PROMPT_IDS[:10]])
    assert client.engine_stats().sessions_open == before.sessions_open + 1
    closed = client.close_session(done.session_id)
    assert closed.length == 10
    after = client.engine_stats()
    assert after.sessions_open == before.sessions_open
    assert after.prompt_tokens >= before.prompt_tokens + 10


def test_a_closed_session_is_not_found(client: LadderClient) -> None:
    _, done = client.prefill([PROMPT_IDS[:5]])
    client.close_session(done.session_id)
    with pytest.raises(grpc.RpcError) as failure:
        completion_of(client.decode(done.session_id, 2))
    assert failure.value.code() == grpc.StatusCode.NOT_FOUND


def test_model_info_describes_the_generated_model_and_its_ladder(client: LadderClient) -> None:
    info = client.model_info()
    assert info.vocab_size == 512
    assert info.chunk_size == 64
    assert list(info.ladder) == [22, 44, 64]
    assert info.has_tokenizer and info.execution_provider == "cpu"


def test_tokenize_then_detokenize_gives_the_text_back(client: LadderClient) -> None:
    ids = client.tokenize("Ladder climbs, one rung at a time.")
    assert ids and all(0 <= i < 512 for i in ids)
    assert client.detokenize(ids) == "Ladder climbs, one rung at a time."


def test_a_token_id_outside_the_vocabulary_is_an_invalid_argument(client: LadderClient) -> None:
    with pytest.raises(grpc.RpcError) as failure:
        client.generate([1, 2, 512], stopping=greedy_stopping(2))
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert client.health() == "SERVING"


def test_a_call_past_its_deadline_ends_with_deadline_exceeded(client: LadderClient) -> None:
    with pytest.raises(grpc.RpcError) as failure:
        client.generate(PROMPT_IDS, stopping=greedy_stopping(200), timeout_s=0.001)
    assert failure.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


def test_samples_logprobs_and_the_new_sampling_options_reach_the_server(client: LadderClient) -> None:
    sampling = Sampling(temperature=0.8, min_p=0.05, presence_penalty=0.5, frequency_penalty=0.5, seed=3)
    completion = client.generate(
        PROMPT_IDS, sampling=sampling, stopping=greedy_stopping(5), n=2, logprobs=Logprobs(top=3)
    )
    assert [len(s.token_ids) for s in completion.samples] == [5, 5]
    assert all(len(p.top) == 3 and p.logprob <= 0 for s in completion.samples for p in s.logprobs)
    alone = client.generate(PROMPT_IDS, sampling=sampling, stopping=greedy_stopping(5))
    assert list(completion.samples[0].token_ids) == list(alone.token_ids)
    forwards, done = client.prefill([PROMPT_IDS])
    try:
        events = list(
            client.decode(done.session_id, 3, stopping=greedy_stopping(3), logprobs=Logprobs(top=1))
        )
        assert [len(e.token.top_logprobs) for e in events if e.WhichOneof("event") == "token"] == [1, 1, 1]
    finally:
        client.close_session(done.session_id)


def test_min_new_tokens_reaches_the_server(client: LadderClient) -> None:
    """This prompt's greedy reply ends with end-of-sequence as its 12th token."""
    ids = [31] + [2] * 8
    assert len(client.generate(ids, stopping=Stopping(max_new_tokens=20)).token_ids) == 12
    held = client.generate(ids, stopping=Stopping(max_new_tokens=20, min_new_tokens=16))
    assert len(held.token_ids) >= 16
