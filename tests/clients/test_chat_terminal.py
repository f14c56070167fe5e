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
import time
from pathlib import Path

import pytest

from clients.python import ChatSession, LadderClient, Stopping, Turn
from clients.python.chat import ReplyStopped
from clients.python.terminal import typed_text
from tests.support.servers import RunningServer

REPO = Path(__file__).resolve().parents[2]
# Linux x86_64 syscalls a program waiting for a key sits in: read, poll, select, pselect6, ppoll.
WAITING_FOR_KEYS = {"0", "7", "23", "270", "271"}


class Terminal:
    """A child process on a pseudo-terminal, and everything it has written there."""

    def __init__(self, argv: list[str]) -> None:
        self.master, slave = os.openpty()
        # TERM=dumb: readline draws the line without cursor-motion sequences.
        self.process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, cwd=REPO,
                                        env={**os.environ, "TERM": "dumb"})
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


def test_ctrl_c_stops_the_reply_keeps_the_chat_and_keys_typed_meanwhile_wait_for_the_prompt(
        server: RunningServer, client: LadderClient) -> None:
    chat = Terminal([sys.executable, "-m", "clients.python.cli", "chat", "--address", server.address,
                     "--max-new-tokens", "300", "--ignore-eos"])
    try:
        chat.type("hello\r")
        reply_starts = chat.expect("assistant> ", chat.expect("you> hello"))
        chat.expect("", reply_starts + 1)  # some of the reply has been shown
        with server.paused():  # no more of the reply can arrive: Ctrl-C lands while it streams
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
        client: LadderClient) -> None:
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
        fresh = client.generate(client.tokenize(turns_before_reply),
                                stopping=Stopping(max_new_tokens=40, ignore_eos=True))
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
