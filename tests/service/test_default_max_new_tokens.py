"""A request that names no max_new_tokens gets the server's configured default, which GetModelInfo reports."""

from __future__ import annotations

from pathlib import Path

from proto.ladder.v1 import ladder_pb2 as pb
from service.config import load_config
from tests.support.prompts import greedy_request, prompt_ids
from tests.support.servers import RunningServer, server_config


def test_a_request_without_max_new_tokens_gets_the_configured_default(served_model: Path) -> None:
    default = load_config({"LADDER_DEFAULT_MAX_NEW_TOKENS": "5"}).default_max_new_tokens
    running = RunningServer(server_config(served_model, default_max_new_tokens=default))
    try:
        info = running.stub.GetModelInfo(pb.GetModelInfoRequest())
        reply = running.stub.Generate(greedy_request(prompt_ids(20, seed=3), 0))
        chunks = list(running.stub.GenerateStream(greedy_request(prompt_ids(20, seed=3), 0)))
        opened = list(
            running.stub.Prefill(
                iter([pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=prompt_ids(20, seed=3))))])
            )
        )[-1].done
        decoded = list(
            running.stub.Decode(
                pb.DecodeRequest(session_id=opened.session_id, stopping=pb.StoppingOptions(ignore_eos=True))
            )
        )
        asked = running.stub.Generate(greedy_request(prompt_ids(20, seed=3), 9))
    finally:
        running.close()
    assert (info.default_max_new_tokens, info.max_new_tokens_limit) == (5, 256)
    assert len(reply.token_ids) == 5 and reply.finish_reason == pb.FINISH_REASON_LENGTH
    assert len(chunks) == 6 and list(chunks[-1].done.token_ids) == list(reply.token_ids)
    assert len(decoded[-1].done.token_ids) == 5
    assert len(asked.token_ids) == 9, "a request that names max_new_tokens gets what it names"


def test_the_default_never_exceeds_the_limit_nor_the_room_left(served_model: Path) -> None:
    running = RunningServer(
        server_config(served_model, max_new_tokens=7, default_max_new_tokens=256, capacity=64)
    )
    try:
        info = running.stub.GetModelInfo(pb.GetModelInfoRequest())
        short = running.stub.Generate(greedy_request(prompt_ids(10, seed=4), 0))
        nearly_full = running.stub.Generate(greedy_request(prompt_ids(60, seed=4), 0))
    finally:
        running.close()
    assert info.default_max_new_tokens == 7
    assert len(short.token_ids) == 7
    # 60 of 64 tokens held: 5 more fit (the last needs no KV slot), and they fill the cache.
    assert len(nearly_full.token_ids) == 5 and nearly_full.finish_reason == pb.FINISH_REASON_CAPACITY


def test_with_default_zero_generate_and_decode_share_one_budget(served_model: Path) -> None:
    """--default-max-new-tokens 0: a call naming none gets as many as fit, up to --max-new-tokens,
    through the one budget (ServedModel.asked_tokens and budget) for Generate and Decode alike."""
    running = RunningServer(
        server_config(served_model, max_new_tokens=9, default_max_new_tokens=0, capacity=64)
    )
    try:
        generated = running.stub.Generate(greedy_request(prompt_ids(20, seed=5), 0))
        near_full = running.stub.Generate(greedy_request(prompt_ids(59, seed=5), 0))
        opened = list(
            running.stub.Prefill(
                iter([pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=prompt_ids(20, seed=5))))])
            )
        )[-1].done
        stopping = pb.StoppingOptions(ignore_eos=True)
        decoded = list(running.stub.Decode(pb.DecodeRequest(session_id=opened.session_id, stopping=stopping)))
        full = list(
            running.stub.Prefill(
                iter([pb.PrefillRequest(prompt=pb.Prompt(tokens=pb.TokenIds(ids=prompt_ids(59, seed=5))))])
            )
        )[-1].done
        decoded_full = list(
            running.stub.Decode(pb.DecodeRequest(session_id=full.session_id, stopping=stopping))
        )
    finally:
        running.close()
    assert len(generated.token_ids) == 9 and len(decoded[-1].done.token_ids) == 9
    assert list(decoded[-1].done.token_ids) == list(generated.token_ids)
    # 59 of 64 held: 6 more fit (the last needs no KV slot), fewer than the limit of 9.
    assert len(near_full.token_ids) == 6 and len(decoded_full[-1].done.token_ids) == 6
