"""`ladder chat` as a user at a terminal meets it: on a pseudo-terminal, against a real server.

Ctrl-C stops the reply and keeps the chat; turns are labelled; keys typed while a reply
streams wait for the next prompt instead of landing inside the reply.
"""

from __future__ import annotations

import os
import platform
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from clients.python import ChatSession, LadderClient, Stopping, Turn
from clients.python.chat import ReplyStopped
from clients.python.terminal import typed_text
from service.worker.rounds import Call
from tests.support.servers import START_TIMEOUT_S, RunningServer

REPO = Path(__file__).resolve().parents[2]
# Linux x86_64 syscalls a program waiting for a key sits in: read, poll, select, pselect6, ppoll.
WAITING_FOR_KEYS = {"0", "7", "23", "270", "271"}


class Terminal:
    """A child process on a pseudo-terminal, and everything it has written there."""

    def __init__(self, argv: list[str]) -> None:
        self.master, slave = os.openpty()
        # A shell starts a foreground program with SIGINT at its default. Tests run as a background
        # job (`cmd &`, nohup) have it ignored, and an ignored signal stays ignored across exec, so
        # Ctrl-C would never reach the chat: handled here while it starts, it is reset at exec.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            # TERM=dumb: readline draws the line without cursor-motion sequences.
            self.process = subprocess.Popen(
                argv, stdin=slave, stdout=slave, stderr=slave, cwd=REPO, env={**os.environ, "TERM": "dumb"}
            )
        finally:
            signal.signal(signal.SIGINT, previous)
        os.close(slave)
        self.transcript = ""

    def expect(self, text: str, start: int = 0, timeout_s: float = 60.0) -> int:
        """Read until `text` appears at or after `start`; return the position just past it."""
        deadline = time.monotonic() + timeout_s  # a guard against a hang, not a speed check
        while (found := self.transcript.find(text, start)) < 0:
            ready, _, _ = select.select([self.master], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"{text!r} never came after {self.transcript[start:]!r}"
            self.transcript += os.read(self.master, 4096).decode("utf-8", errors="replace")
        return found + len(text)

    def shows(self, start: int, timeout_s: float) -> bool:
        """Whether anything has been written at or after `start`, reading for up to `timeout_s`."""
        if len(self.transcript) <= start:
            ready, _, _ = select.select([self.master], [], [], timeout_s)
            if ready:
                self.transcript += os.read(self.master, 4096).decode("utf-8", errors="replace")
        return len(self.transcript) > start

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def interrupt(self) -> None:
        """What Ctrl-C does: SIGINT to the program."""
        self.process.send_signal(signal.SIGINT)

    def wait_until_reading_keys(self, timeout_s: float = 60.0) -> None:
        """Until the program blocks for a key. readline notices a signal only when it interrupts its
        select(): one sent the instant the prompt appears, before select() starts, waits for the next
        key. A person is never that fast; a test is, so it waits for the program to sit in select()."""
        syscall = Path(f"/proc/{self.process.pid}/syscall")
        if platform.machine() != "x86_64" or not syscall.exists():
            return  # the numbers above are Linux x86_64's: elsewhere, nothing to watch
        deadline = time.monotonic() + timeout_s  # a guard against a hang, not a speed check
        while syscall.read_text().split()[0] not in WAITING_FOR_KEYS:
            assert time.monotonic() < deadline, f"never blocked for a key: {syscall.read_text()!r}"
            time.sleep(0.01)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        os.close(self.master)


def hold_worker(server: RunningServer) -> tuple[threading.Event, threading.Event]:
    """Queue a call that holds the engine worker (as `RunningServer.frozen` does): the events
    set once the worker is inside it, and the one that lets it go."""
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        inside.set()
        release.wait(START_TIMEOUT_S)

    def body() -> Iterator[Call]:
        yield Call(hold)

    async def submit() -> None:
        server.scheduler.submit(body(), bounded=False)

    server.run(submit())
    return inside, release


@contextmanager
def worker_held_between_rounds(server: RunningServer) -> Iterator[Callable[[], None]]:
    """Hold the engine worker until the block ends; yields `next_round`, which lets it run one round.

    The next hold is queued before the last one lets go, so the worker comes round to it after one
    round: a decode stream advances by one token per `next_round`, however loaded the machine is."""
    inside, release = hold_worker(server)
    assert inside.wait(START_TIMEOUT_S), "the engine worker did not come round"

    def next_round() -> None:
        nonlocal inside, release
        following = hold_worker(server)
        release.set()
        inside, release = following
        assert inside.wait(START_TIMEOUT_S), "the engine worker did not come round"

    try:
        yield next_round
    finally:
        release.set()


REPLY_TOKENS = 300


def test_ctrl_c_stops_the_reply_keeps_the_chat_and_keys_typed_meanwhile_wait_for_the_prompt(
    server: RunningServer, client: LadderClient
) -> None:
    chat = Terminal(
        [
            sys.executable,
            "-m",
            "clients.python.cli",
            "chat",
            "--address",
            server.address,
            "--max-new-tokens",
            str(REPLY_TOKENS),
            "--ignore-eos",
        ]
    )
    try:
        # The worker runs only the rounds the test lets it, so the reply cannot end before Ctrl-C.
        with worker_held_between_rounds(server) as next_round:
            before = max((step.round for step in server.steps()), default=0)

            def decode_forwards() -> int:  # since the chat began: a token of its reply each
                return sum(1 for step in server.steps() if step.round > before and step.decode)

            chat.type("hello\r")
            reply_starts = chat.expect("assistant> ", chat.expect("you> hello"))
            # A round at a time until some of the reply is shown. A token goes out in the round after
            # the one that made it, so until two decode forwards have run the test only paces the
            # rounds; after that it waits for the terminal (a guard against a hang, not a speed
            # check) before letting another round go.
            while not chat.shows(reply_starts, timeout_s=0.01 if decode_forwards() < 2 else 5.0):
                assert decode_forwards() < REPLY_TOKENS // 2, f"no reply text yet: {chat.transcript!r}"
                next_round()
            # Some of the reply has been shown and no more of it is made: Ctrl-C lands while it streams.
            chat.type("next qu")
            chat.interrupt()
            reply_ends = chat.expect(" [stopped]", reply_starts)
            prompt_ends = chat.expect("you> next qu", reply_ends)
        assert "next qu" not in chat.transcript[reply_starts:reply_ends]
        chat.type("estion\r")
        second_reply = chat.expect("assistant> ", prompt_ends)
        second_ends = chat.expect("you> ", second_reply)
        assert "[stopped]" not in chat.transcript[second_reply:second_ends]
        assert chat.transcript[second_reply:second_ends].strip()
        chat.wait_until_reading_keys()
        chat.interrupt()  # Ctrl-C at the prompt ends the chat
        assert chat.process.wait(30) == 0
    finally:
        chat.close()
    assert client.engine_stats().sessions_open == 0


def test_a_stopped_reply_stays_in_the_chat_and_the_next_turn_answers_like_a_fresh_generate(
    client: LadderClient,
) -> None:
    chat = ChatSession(client, max_new_tokens=40, ignore_eos=True)
    shown: list[str] = []

    def stop_after_three_pieces(piece: str) -> None:
        shown.append(piece)
        if len(shown) == 3:
            raise KeyboardInterrupt

    try:
        with pytest.raises(ReplyStopped) as stopped:
            chat.ask("Tell me a story.", on_text=stop_after_three_pieces)
        assert stopped.value.text == "".join(shown)
        assert chat.turns[-1] == Turn("assistant", stopped.value.text)
        turns_before_reply = [*chat.turns, Turn("user", "Go on.")]
        reply = chat.ask("Go on.")
        fresh = client.generate(
            client.tokenize(turns_before_reply), stopping=Stopping(max_new_tokens=40, ignore_eos=True)
        )
        assert list(reply.token_ids) == list(fresh.token_ids)
    finally:
        chat.close()
    assert client.engine_stats().sessions_open == 0


def test_keys_typed_during_a_reply_keep_their_text_and_edits_and_drop_the_rest() -> None:
    assert typed_text("", "next qu") == "next qu"
    assert typed_text("ab", "c\x7f\x7fx") == "ax"
    assert typed_text("", "one\rtwo") == "one\ntwo"
    assert typed_text("done\n", "\x7f") == "done\n"  # a line already asked is not edited
    assert typed_text("", "left\x1b[Dgone\x15kept\x04") == "kept"


def test_a_chat_reply_longer_than_the_kv_has_room_for_is_cut_to_fit_not_refused(client: LadderClient) -> None:
    capacity = client.model_info().capacity
    prompt = client.tokenize([Turn("user", "Talk for as long as you can.")])
    chat = ChatSession(client, max_new_tokens=4 * capacity, ignore_eos=True)
    try:
        reply = chat.ask("Talk for as long as you can.")
        assert len(reply.token_ids) == capacity - len(prompt)
        assert reply.session_length <= capacity
    finally:
        chat.close()
