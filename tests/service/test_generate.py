"""Generate and GenerateStream over a real channel: the engine's tokens, with plan, usage and timing."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from grpc_health.v1 import health_pb2, health_pb2_grpc

from engine.modelgen.synthetic import VARIANTS, build_synthetic
from proto.ladder.v1 import ladder_pb2 as pb
from tests.support.engines import greedy_by_appending, load
from tests.support.prompts import greedy_request, prompt_ids
from tests.support.servers import RunningServer, server_config


def engine_greedy(served_model: Path, tokens: list[int], n: int) -> list[int]:
    """The engine's greedy tokens, one session alone, appending each token as a whole forward."""
    return greedy_by_appending(load(served_model), tokens, n)


def test_health_answers_serving_for_the_server_and_the_ladder_service(server: RunningServer) -> None:
    health = health_pb2_grpc.HealthStub(server.channel)
    for name in ("", "ladder.v1.Ladder"):
        reply = health.Check(health_pb2.HealthCheckRequest(service=name))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_generate_returns_the_engines_own_greedy_tokens(server: RunningServer, served_model: Path) -> None:
    tokens = prompt_ids(150, seed=1)
    reply = server.stub.Generate(greedy_request(tokens, 12))
    assert list(reply.token_ids) == engine_greedy(served_model, tokens, 12)
    assert reply.finish_reason == pb.FINISH_REASON_LENGTH
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (150, 12)


def test_generate_reports_the_prefill_plan_on_the_ladder(server: RunningServer) -> None:
    reply = server.stub.Generate(greedy_request(prompt_ids(150, seed=2), 2))
    ladder = set(server.stub.GetModelInfo(pb.GetModelInfoRequest()).ladder)
    plan = reply.prefill
    assert (plan.forwards, plan.real_rows) == (3, 150)  # 64 + 64 + 22 at chunk 64
    assert set(plan.widths) <= ladder
    assert plan.padded_rows == sum(plan.widths) - 150


def test_the_stream_carries_the_same_tokens_as_the_unary_call_and_ends_with_the_completion(
    server: RunningServer,
) -> None:
    request = greedy_request(prompt_ids(40, seed=3), 10)
    events = list(server.stub.GenerateStream(request))
    tokens = [e.token for e in events if e.HasField("token")]
    done = events[-1].done
    assert [t.id for t in tokens] == list(done.token_ids) == list(server.stub.Generate(request).token_ids)
    assert [t.index for t in tokens] == list(range(10))
    assert done.timing.ttft_ms > 0 and len(done.timing.inter_token_ms) == 9


def test_text_and_chat_prompts_are_tokenized_with_the_models_tokenizer(server: RunningServer) -> None:
    ids = list(server.stub.Tokenize(pb.TokenizeRequest(text="hello ladder")).ids)
    stopping = pb.StoppingOptions(max_new_tokens=4, ignore_eos=True)
    text = pb.Prompt(text="hello ladder")
    by_text = server.stub.Generate(pb.GenerateRequest(prompt=text, stopping=stopping))
    by_ids = server.stub.Generate(greedy_request(ids, 4))
    assert list(by_text.token_ids) == list(by_ids.token_ids)
    assert by_text.text == server.stub.Detokenize(pb.DetokenizeRequest(ids=by_text.token_ids)).text
    chat = pb.Chat(messages=[pb.ChatMessage(role="user", content="hi")])
    reply = server.stub.Generate(
        pb.GenerateRequest(prompt=pb.Prompt(chat=chat), stopping=pb.StoppingOptions(max_new_tokens=3))
    )
    assert reply.usage.prompt_tokens > 3


def test_a_stop_sequence_ends_generation_and_is_cut_from_the_text(server: RunningServer) -> None:
    free = server.stub.Generate(
        pb.GenerateRequest(
            prompt=pb.Prompt(text="abc"), stopping=pb.StoppingOptions(max_new_tokens=12, ignore_eos=True)
        )
    )
    stop = free.text[3:5]
    assert stop, "the free-running text is long enough to pick a stop sequence from"
    stopped = server.stub.Generate(
        pb.GenerateRequest(
            prompt=pb.Prompt(text="abc"),
            stopping=pb.StoppingOptions(max_new_tokens=12, ignore_eos=True, stop=[stop]),
        )
    )
    assert stopped.finish_reason == pb.FINISH_REASON_STOP
    assert stopped.text == free.text[: free.text.find(stop)]


def test_seeded_sampling_repeats_itself(server: RunningServer) -> None:
    request = greedy_request(prompt_ids(30, seed=4), 10)
    request.sampling.CopyFrom(pb.SamplingOptions(temperature=1.0, top_k=50, top_p=0.9, seed=7))
    assert list(server.stub.Generate(request).token_ids) == list(server.stub.Generate(request).token_ids)


def test_eight_concurrent_greedy_streams_match_the_same_requests_run_one_by_one(
    server: RunningServer,
) -> None:
    requests = [greedy_request(prompt_ids(20 + 37 * i, seed=10 + i), 16) for i in range(8)]

    def stream(request: pb.GenerateRequest) -> list[int]:
        return [e.token.id for e in server.stub.GenerateStream(request) if e.HasField("token")]

    alone = [stream(r) for r in requests]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(stream, requests))
    assert together == alone
    assert server.stats().sessions_open == 0


def test_engine_stats_count_sessions_whose_padding_the_self_check_turned_off(tmp_path: Path) -> None:
    path = build_synthetic(VARIANTS["last_row"], tmp_path)  # a decoder that emits only its last row
    running = RunningServer(server_config(path))
    try:
        reply = running.stub.Generate(greedy_request(prompt_ids(30, seed=50), 4))
        stats = running.stats()
    finally:
        running.close()
    assert stats.sessions_padding_off == 1
    assert reply.prefill.padded_rows == 0 and list(reply.prefill.widths) == [30]


def test_engine_stats_say_which_exactness_rules_this_machine_measured(server: RunningServer) -> None:
    rules = server.stub.GetEngineStats(pb.GetEngineStatsRequest()).exactness
    assert rules.measured and rules.restore_rule in ("two_rows", "fresh_forwards")
    assert rules.least_decode_batch == (2 if rules.one_row_gap > 0 else 1)
