"""Multi-turn chat on one server-side session, and the `ladder` CLI, against a real server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from clients.python import ChatSession, LadderClient, Sampling, Stopping, Turn
from clients.python.chat import common_prefix_length
from clients.python.cli import main
from tests.support.servers import RunningServer

REPO = Path(__file__).resolve().parents[2]


def test_a_second_chat_turn_extends_the_same_session_and_answers_like_a_fresh_generate(
    client: LadderClient,
) -> None:
    chat = ChatSession(client, system="You are terse.", max_new_tokens=12)
    try:
        chat.ask("What is a ladder?")
        first_session, held_after_first = chat.session_id, len(chat.held)
        turns_before_reply = [*chat.turns, Turn("user", "And a rung?")]
        pieces: list[str] = []
        reply = chat.ask("And a rung?", on_text=pieces.append)
        assert chat.session_id == first_session
        assert len(chat.held) > held_after_first
        assert client.engine_stats().sessions_open == 1
        fresh = client.generate(client.tokenize(turns_before_reply), stopping=Stopping(max_new_tokens=12))
        assert list(reply.token_ids) == list(fresh.token_ids)
        assert "".join(pieces) == reply.text
    finally:
        chat.close()
    assert client.engine_stats().sessions_open == 0


def test_common_prefix_length_stops_at_the_first_difference() -> None:
    assert common_prefix_length([1, 2, 3, 4], [1, 2, 9]) == 2
    assert common_prefix_length([], [1]) == 0
    assert common_prefix_length([5, 6], [5, 6]) == 2


def test_ladder_generate_prints_the_greedy_completion(
    server: RunningServer, client: LadderClient, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "generate",
        "--address",
        server.address,
        "--max-new-tokens",
        "9",
        "--ignore-eos",
        "--usage",
        "The capital of France is",
    ]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    stopping = Stopping(max_new_tokens=9, ignore_eos=True)
    expected = client.generate("The capital of France is", stopping=stopping)
    assert out == expected.text + "\n"
    assert "completion_tokens=9" in err and "finish=length" in err


def test_ladder_generate_passes_min_p_and_the_penalties(
    server: RunningServer, client: LadderClient, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = [
        "--temperature",
        "0.9",
        "--seed",
        "5",
        "--min-p",
        "0.1",
        "--presence-penalty",
        "1.5",
        "--frequency-penalty",
        "-0.5",
    ]
    assert (
        main(
            [
                "generate",
                "--address",
                server.address,
                "--tokens",
                "--ids",
                "--max-new-tokens",
                "6",
                "--ignore-eos",
                *flags,
                "5 6 7 8 9",
            ]
        )
        == 0
    )
    sampling = Sampling(temperature=0.9, seed=5, min_p=0.1, presence_penalty=1.5, frequency_penalty=-0.5)
    expected = client.generate(
        [5, 6, 7, 8, 9], sampling=sampling, stopping=Stopping(max_new_tokens=6, ignore_eos=True)
    )
    assert capsys.readouterr().out.split() == [str(t) for t in expected.token_ids]
    assert main(["generate", "--address", server.address, "--tokens", "--min-p", "2", "5 6"]) == 1


def test_ladder_generate_takes_token_ids_and_prints_ids(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "generate",
        "--address",
        server.address,
        "--tokens",
        "--ids",
        "--max-new-tokens",
        "4",
        "--ignore-eos",
        "5 6 7 8 9",
    ]
    assert main(argv) == 0
    ids = capsys.readouterr().out.split()
    assert len(ids) == 4 and all(0 <= int(i) < 512 for i in ids)


def test_ladder_stats_prints_model_info_and_engine_stats_as_json(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["stats", "--address", server.address]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"]["vocab_size"] == 512 and doc["model"]["ladder"] == [22, 44, 64]
    assert "sessions_open" in doc["engine"] and "variants" in doc["engine"]


def test_ladder_health_exits_0_when_serving_and_1_when_unreachable(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["health", "--address", server.address]) == 0
    assert capsys.readouterr().out.strip() == "SERVING"
    assert main(["health", "--address", "127.0.0.1:1", "--wait", "0.3"]) == 1


def test_ladder_reports_an_rpc_failure_with_its_status_and_exit_1(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["generate", "--address", server.address, "--tokens", "1 2 99999"]) == 1
    assert "INVALID_ARGUMENT" in capsys.readouterr().err


def test_ladder_chat_answers_each_line_on_one_session_and_closes_it(
    server: RunningServer, client: LadderClient
) -> None:
    cmd = [
        sys.executable,
        "-m",
        "clients.python.cli",
        "chat",
        "--address",
        server.address,
        "--max-new-tokens",
        "6",
        "--system",
        "Be brief.",
    ]
    done = subprocess.run(
        cmd, input="hello\nhow are you?\n", capture_output=True, text=True, cwd=REPO, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert client.engine_stats().sessions_open == 0
    same = ChatSession(client, system="Be brief.", max_new_tokens=6)
    try:
        replies = [same.ask("hello").text, same.ask("how are you?").text]
    finally:
        same.close()
    assert done.stdout == "".join(reply + "\n" for reply in replies)
