"""The smaller items of the OpenAI-compatible API (issue 41) through a real server: vLLM's
min_tokens, completions with several prompts, echo (with the prompt's log-probabilities), where the
finish reason goes in a stream, and text_offset.
"""

from __future__ import annotations

import http.client
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from proto.ladder.v1 import ladder_pb2 as pb
from service.front.stop_text import StopText
from tests.service.test_openai_http import client, events, http_server, post
from tests.support.servers import RunningServer
from tests.support.waiting import wait_for

PROMPT = "The quick brown fox"
OTHER = "Count:"
GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": 8, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(served_model: Path) -> Iterator[RunningServer]:
    with http_server(served_model, max_new_tokens=1000) as running:  # a stream long enough to leave
        yield running


@pytest.fixture(scope="module")
def sdk(server: RunningServer) -> openai.OpenAI:
    return client(server)


def complete(server: RunningServer, **body: Any) -> dict[str, Any]:
    """A /v1/completions answer (200 asserted)."""
    response, data = post(server, "/v1/completions", body)
    assert response.status == 200, data
    answer: dict[str, Any] = json.loads(data)
    return answer


def streamed(server: RunningServer, **body: Any) -> list[dict[str, Any]]:
    """The chunks of a streamed /v1/completions call ([DONE] checked and left out)."""
    response, data = post(server, "/v1/completions", {**body, "stream": True})
    assert response.status == 200, data
    found = events(data)
    assert found[-1] == "[DONE]"
    return [json.loads(d) for d in found[:-1]]


def refused_param(server: RunningServer, path: str, body: dict[str, Any]) -> str:
    response, data = post(server, path, body)
    assert response.status == 400, data
    param: str = json.loads(data)["error"]["param"]
    return param


def texts_of(chunks: list[dict[str, Any]]) -> dict[int, str]:
    joined: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            joined[choice["index"]] = joined.get(choice["index"], "") + choice["text"]
    return joined


# -- min_tokens ---------------------------------------------------------------------------------------


def test_min_tokens_holds_end_of_sequence_back_until_the_sample_has_that_many_tokens(
    server: RunningServer,
) -> None:
    """Under this regex the model ends at once ("4", then end-of-sequence); min_tokens masks the end
    out of the first choices, so the sample goes on (the regex still holds)."""
    body = {
        "prompt": "Numbers",
        "temperature": 0,
        "max_tokens": 12,
        "structured_outputs": {"regex": "[0-9]{1,12}"},
    }
    free = complete(server, **body)
    assert free["choices"][0]["text"] == "4" and free["usage"]["completion_tokens"] == 2
    held = complete(server, **body, min_tokens=6)
    text = held["choices"][0]["text"]
    assert text.isdigit() and len(text) >= 6 and held["usage"]["completion_tokens"] >= 6
    assert held["choices"][0]["finish_reason"] == "stop"


def test_min_tokens_holds_end_of_sequence_back_on_a_free_sample_and_changes_nothing_before(
    server: RunningServer,
) -> None:
    """This prompt's greedy reply ends with end-of-sequence as its 12th token; with min_tokens 16 it
    is the same reply up to there (masking the end changes no earlier choice) and goes on."""
    body = {"prompt": [31] + [2] * 8, "temperature": 0, "max_tokens": 20}
    free = complete(server, **body)
    assert free["usage"]["completion_tokens"] == 12 and free["choices"][0]["finish_reason"] == "stop"
    held = complete(server, **body, min_tokens=16)
    assert held["usage"]["completion_tokens"] >= 16
    assert held["choices"][0]["text"].startswith(free["choices"][0]["text"])
    assert len(held["choices"][0]["text"]) > len(free["choices"][0]["text"])


def test_min_tokens_holds_stop_token_ids_back_and_lets_them_end_the_sample_after(
    server: RunningServer,
) -> None:
    free = server.stub.Generate(
        pb.GenerateRequest(
            prompt=pb.Prompt(text=PROMPT), stopping=pb.StoppingOptions(max_new_tokens=12, ignore_eos=True)
        )
    )
    stop_id = free.token_ids[1]
    early = complete(server, prompt=PROMPT, **GREEDY, stop_token_ids=[stop_id])
    assert early["usage"]["completion_tokens"] == 2 and early["choices"][0]["finish_reason"] == "stop"
    held = complete(
        server, prompt=PROMPT, **{**GREEDY, "max_tokens": 12}, stop_token_ids=[stop_id], min_tokens=5
    )
    assert held["usage"]["completion_tokens"] >= 5


def test_min_tokens_keeps_a_stop_string_from_ending_the_text_before_it_has_that_many_tokens(
    sdk: openai.OpenAI, server: RunningServer
) -> None:
    free = complete(server, prompt=PROMPT, **GREEDY)["choices"][0]["text"]
    stop = free[1:3]
    assert complete(server, prompt=PROMPT, **GREEDY, stop=[stop])["choices"][0]["text"] == free[:1]
    held = complete(server, prompt=PROMPT, **GREEDY, stop=[stop], min_tokens=8)
    assert held["choices"][0]["text"] == free and held["choices"][0]["finish_reason"] == "length"
    chat = sdk.chat.completions.create(
        model="",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=6,
        temperature=0,
        extra_body={"min_tokens": 6, "stop_token_ids": [2]},
    )
    assert chat.usage is not None and chat.usage.completion_tokens == 6


def test_min_tokens_out_of_range_is_400_naming_min_tokens(server: RunningServer) -> None:
    for path, extra in (
        ("/v1/completions", {"prompt": PROMPT}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ):
        for bad in (
            {"min_tokens": -1},
            {"min_tokens": 9, "max_tokens": 8},
            {"min_tokens": "3"},
            {"min_tokens": 10**6},
        ):
            assert refused_param(server, path, {**extra, **bad}) == "min_tokens", (path, bad)


# -- several prompts ----------------------------------------------------------------------------------


def test_a_list_of_prompts_answers_n_choices_per_prompt_in_order_with_the_usage_summed(
    server: RunningServer,
) -> None:
    one = [complete(server, prompt=p, **GREEDY) for p in (PROMPT, OTHER)]
    both = complete(server, prompt=[PROMPT, OTHER], n=2, **GREEDY)
    assert [c["index"] for c in both["choices"]] == [0, 1, 2, 3]
    assert [c["text"] for c in both["choices"]] == [one[0]["choices"][0]["text"]] * 2 + [
        one[1]["choices"][0]["text"]
    ] * 2
    assert both["usage"]["prompt_tokens"] == sum(o["usage"]["prompt_tokens"] for o in one)
    assert both["usage"]["completion_tokens"] == 4 * 8
    assert both["usage"]["total_tokens"] == both["usage"]["prompt_tokens"] + 4 * 8


def test_prompts_as_token_id_lists_answer_as_their_text_does(server: RunningServer) -> None:
    ids = [list(server.stub.Tokenize(pb.TokenizeRequest(text=p)).ids) for p in (PROMPT, OTHER)]
    by_text = complete(server, prompt=[PROMPT, OTHER], **GREEDY)
    by_ids = complete(server, prompt=ids, **GREEDY)
    assert [c["text"] for c in by_ids["choices"]] == [c["text"] for c in by_text["choices"]]
    single = complete(server, prompt=ids[1], **GREEDY)
    assert single["choices"][0]["text"] == by_text["choices"][1]["text"]


def test_a_streamed_list_of_prompts_joins_to_the_unstreamed_choices(server: RunningServer) -> None:
    whole = complete(server, prompt=[PROMPT, OTHER], n=2, **GREEDY)
    chunks = streamed(server, prompt=[PROMPT, OTHER], n=2, **GREEDY, stream_options={"include_usage": True})
    assert texts_of(chunks[:-1]) == {c["index"]: c["text"] for c in whole["choices"]}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]


def test_a_bad_prompt_in_a_list_is_400_before_any_work(server: RunningServer) -> None:
    for bad in ([PROMPT, 3], [PROMPT, []], [[1, 2], "x", None], []):
        assert refused_param(server, "/v1/completions", {"prompt": bad, "max_tokens": 2}) == "prompt"
    response, data = post(
        server, "/v1/completions", {"prompt": [PROMPT, [10**6]], "max_tokens": 2, "stream": True}
    )
    assert response.status == 400 and json.loads(data)["error"]["code"] == "token_out_of_vocabulary"


# -- echo -----------------------------------------------------------------------------------------


def test_echo_prepends_each_prompt_to_its_choices_streamed_or_not(server: RunningServer) -> None:
    plain = complete(server, prompt=[PROMPT, OTHER], **GREEDY)
    echoed = complete(server, prompt=[PROMPT, OTHER], echo=True, **GREEDY)
    assert [c["text"] for c in echoed["choices"]] == [
        prompt + c["text"] for prompt, c in zip((PROMPT, OTHER), plain["choices"], strict=True)
    ]
    chunks = streamed(server, prompt=[PROMPT, OTHER], echo=True, **GREEDY)
    assert texts_of(chunks) == {c["index"]: c["text"] for c in echoed["choices"]}
    ids = list(server.stub.Tokenize(pb.TokenizeRequest(text=PROMPT)).ids)
    by_ids = complete(server, prompt=ids, echo=True, **GREEDY)
    assert by_ids["choices"][0]["text"] == echoed["choices"][0]["text"]


def test_echo_with_logprobs_scores_the_prompt_tokens_first_null_as_lm_eval_reads_them(
    server: RunningServer,
) -> None:
    """lm-eval's loglikelihood: echo, max_tokens 1, logprobs 1; the prompt's log-probabilities are
    those gRPC's Generate answers with logprobs.prompt."""
    ids = list(server.stub.Tokenize(pb.TokenizeRequest(text=PROMPT)).ids)
    grpc = server.stub.Generate(
        pb.GenerateRequest(
            prompt=pb.Prompt(text=PROMPT),
            stopping=pb.StoppingOptions(max_new_tokens=1, ignore_eos=True),
            logprobs=pb.LogprobOptions(top=1, prompt=True),
        )
    )
    got = complete(server, prompt=PROMPT, echo=True, max_tokens=1, logprobs=1, temperature=0)
    choice = got["choices"][0]
    choice_logprobs = choice["logprobs"]
    assert len(choice_logprobs["tokens"]) == len(ids) + 1
    assert choice_logprobs["token_logprobs"][0] is None and choice_logprobs["top_logprobs"][0] is None
    scored = choice_logprobs["token_logprobs"][1 : len(ids)]
    assert scored == pytest.approx([p.logprob for p in grpc.prompt_logprobs], abs=1e-5)
    assert choice["text"] == PROMPT + grpc.text
    offsets = choice_logprobs["text_offset"]
    assert offsets[0] == 0 and offsets == sorted(offsets) and offsets[len(ids)] == len(PROMPT)
    assert "".join(choice_logprobs["tokens"][: len(ids)]) == PROMPT  # a byte-level vocabulary: plain text


def test_streamed_echo_with_logprobs_sends_the_prompt_s_scores_before_the_reply(
    server: RunningServer,
) -> None:
    whole = complete(server, prompt=PROMPT, echo=True, logprobs=2, **GREEDY)["choices"][0]
    chunks = streamed(server, prompt=PROMPT, echo=True, logprobs=2, **GREEDY)
    assert chunks[0]["choices"][0]["text"] == PROMPT
    joined: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for chunk in chunks:
        found = chunk["choices"][0]["logprobs"]
        for key in joined:
            joined[key] += found[key] if found else []
    assert joined == whole["logprobs"]
    assert texts_of(chunks)[0] == whole["text"]


def test_the_openai_sdk_reads_a_batch_with_echo_and_logprobs_as_lm_eval_sends_it(
    sdk: openai.OpenAI, server: RunningServer
) -> None:
    """lm-eval's local-completions loglikelihood: a batch of prompts, echo, max_tokens 1, logprobs 1."""
    got = sdk.completions.create(
        model="", prompt=[PROMPT, OTHER], echo=True, max_tokens=1, logprobs=1, temperature=0
    )
    assert [c.index for c in got.choices] == [0, 1]
    for prompt, choice in zip((PROMPT, OTHER), got.choices, strict=True):
        ids = list(server.stub.Tokenize(pb.TokenizeRequest(text=prompt)).ids)
        found = choice.logprobs
        assert choice.text.startswith(prompt) and found is not None and found.token_logprobs is not None
        assert found.token_logprobs[0] is None and len(found.token_logprobs) == len(ids) + 1
        assert all(isinstance(v, float) and v <= 0 for v in found.token_logprobs[1:])
    assert got.usage is not None and got.usage.completion_tokens == 2


# -- the finish reason of a stream, text_offset --------------------------------------------------------


def test_each_streamed_choice_has_its_finish_reason_on_its_last_chunk_and_on_no_other(
    server: RunningServer,
) -> None:
    chunks = streamed(server, prompt=[PROMPT, OTHER], n=2, temperature=1, seed=4, max_tokens=6, stop=["e"])
    by_choice: dict[int, list[Any]] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            by_choice.setdefault(choice["index"], []).append(choice["finish_reason"])
    assert sorted(by_choice) == [0, 1, 2, 3]
    for reasons in by_choice.values():
        assert reasons[-1] in ("stop", "length") and reasons[:-1] == [None] * (len(reasons) - 1)


def test_text_offset_is_where_each_token_s_text_starts_in_the_choice_s_text(server: RunningServer) -> None:
    """Each offset is the length of the text the tokens before it made (gRPC's streamed pieces): a
    token that begins a multi-byte character adds nothing, and the one that ends it starts where
    the character does (its own text alone is U+FFFD)."""
    prompt = PROMPT  # its reply holds a character split over two tokens
    pieces = [
        e.token.text
        for e in server.stub.GenerateStream(
            pb.GenerateRequest(
                prompt=pb.Prompt(text=prompt), stopping=pb.StoppingOptions(max_new_tokens=12, ignore_eos=True)
            )
        )
        if e.HasField("token")
    ]
    want = [sum(len(p) for p in pieces[:i]) for i in range(12)]
    assert len(set(want)) < 12, "some token makes no text of its own"
    got = complete(server, prompt=prompt, logprobs=0, temperature=0, max_tokens=12, ignore_eos=True)
    choice = got["choices"][0]
    assert choice["text"] == "".join(pieces) and choice["logprobs"]["text_offset"] == want
    chunks = streamed(server, prompt=prompt, logprobs=0, temperature=0, max_tokens=12, ignore_eos=True)
    assert [
        o for c in chunks if c["choices"][0]["logprobs"] for o in c["choices"][0]["logprobs"]["text_offset"]
    ] == want


def test_an_unarmed_stop_text_passes_whole_stops_over_and_finds_one_that_ends_once_armed() -> None:
    """min_tokens' stop strings (service/front/stop_text.py): before the sample is long enough no stop
    ends it, text that could begin one is still held, and once armed a stop that ends in the next
    piece is found (one that began before) while one wholly passed over is not."""
    rng = random.Random(11)
    for _ in range(2000):
        stops = [
            "".join(rng.choice("ab") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))
        ]
        stop_text = StopText(stops, armed=False)
        for _ in range(rng.randint(0, 6)):
            piece = "".join(rng.choice("abc") for _ in range(rng.randint(0, 3)))
            before = stop_text.held + piece
            out = stop_text.push(piece)
            assert not stop_text.stopped and out + stop_text.held == before
        stop_text.armed = True
        held = stop_text.held
        piece = "".join(rng.choice("abc") for _ in range(rng.randint(1, 4)))
        out = stop_text.push(piece)
        text = held + piece
        ends_in_piece = any(text[:k].endswith(s) for s in stops for k in range(len(held) + 1, len(text) + 1))
        assert stop_text.stopped == ends_in_piece
        if not ends_in_piece:
            assert out + stop_text.held == text


def finished(server: RunningServer, reason: str) -> float:
    labels = {"method": "/v1/completions", "reason": reason}
    return server.server.metrics.registry.get_sample_value("ladder_finished_total", labels) or 0.0


def test_every_prompt_s_samples_are_counted_however_the_call_ends(server: RunningServer) -> None:
    """Each prompt is a generation of its own: each sample's finish counts, and a client that leaves
    a stream of several prompts mid-way cuts every prompt's samples short (counted as cancelled)."""
    before = finished(server, "length")
    complete(server, prompt=[PROMPT, OTHER], n=2, **GREEDY)
    assert finished(server, "length") - before == 4
    cancelled = finished(server, "cancelled")
    connection = http.client.HTTPConnection("127.0.0.1", server.config.http_port, timeout=30)
    body = {"prompt": [PROMPT, OTHER], "max_tokens": 1000, "ignore_eos": True, "stream": True}
    connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200 and response.read1(64)
    connection.close()
    wait_for(lambda: finished(server, "cancelled") - cancelled == 2, what="both prompts' samples cancelled")
