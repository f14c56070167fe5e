"""The terminal side of `ladder chat`: labelled turns, and keys typed while a reply streams held back.

On a terminal every turn is labelled: the user's line follows "you> ", the reply
follows "assistant> ". While a reply streams, the terminal's echo and line editing
are off, so keys typed meanwhile neither land inside the reply nor get lost: they
are read when it ends and put back on the next prompt line, still editable (a whole
line typed ahead is asked next, shown after its label). Without a terminal (a pipe)
nothing but the replies is written to stdout, one per line.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

try:
    import readline
except ImportError:  # no GNU readline/libedit (Windows): lines are read without editing
    readline = None  # type: ignore[assignment]

try:
    import termios
except ImportError:
    termios = None  # type: ignore[assignment]

YOU = "you> "
ASSISTANT = "assistant> "
STOPPED = " [stopped]"
# Keys that are not text: escape sequences (arrows, function keys) and control characters other than
# backspace, tab, newline and Ctrl-U.
_NOT_TEXT = re.compile(r"\x1b(\[[0-9;?]*[ -/]*[@-~]|O.|.)?|[\x00-\x07\x0b-\x14\x16-\x1f]")


def typed_text(pending: str, keys: str) -> str:
    """`pending` after keys typed during a reply: backspace and Ctrl-U applied, other controls dropped."""
    for key in _NOT_TEXT.sub("", keys.replace("\r", "\n")):
        if key in "\x7f\b":
            pending = pending[:-1] if pending[-1:] not in ("", "\n") else pending
        elif key == "\x15":  # Ctrl-U kills the line being typed
            pending = pending[: pending.rfind("\n") + 1]
        else:
            pending += key
    return pending


class ChatTerminal:
    """Reads the user's lines and shows replies, labelled on a terminal."""

    def __init__(self, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> None:
        self.stdin = stdin
        self.stdout = stdout
        self.interactive = stdin.isatty() and stdout.isatty()
        self.pending = ""  # typed while a reply streamed, not asked yet

    def read_question(self) -> str | None:
        """The next non-empty line, or None at end of input (Ctrl-D)."""
        while True:
            line = self._read_line()
            if line is None or line.strip():
                return None if line is None else line.strip()

    def _read_line(self) -> str | None:
        if not self.interactive:
            line = self.stdin.readline()
            return line or None
        typed_ahead, newline, rest = self.pending.partition("\n")
        if newline:
            self.pending = rest
            self.write(f"{YOU}{typed_ahead}\n")
            return typed_ahead
        self.pending = ""
        return _input_prefilled(YOU, typed_ahead, self.stdin, self.write)

    @contextmanager
    def reply(self) -> Iterator[Callable[[str], None]]:
        """While the reply streams: its label first, keys typed meanwhile held; yields the writer."""
        if self.interactive:
            self.write(ASSISTANT)
        with self._holding_keys():
            yield self.write
        self.write("\n")

    def stopped(self) -> None:
        """Mark a reply Ctrl-C cut short (the next line ends it)."""
        if self.interactive:
            self.write(STOPPED)

    def write(self, text: str) -> None:
        self.stdout.write(text)
        self.stdout.flush()

    @contextmanager
    def _holding_keys(self) -> Iterator[None]:
        if not self.interactive or termios is None:
            yield
            return
        fd = self.stdin.fileno()
        saved = termios.tcgetattr(fd)
        quiet = termios.tcgetattr(fd)
        # No echo, no line editing, reads that never block; ISIG stays on so Ctrl-C still stops the reply.
        quiet[3] &= ~(termios.ECHO | termios.ICANON)
        quiet[6][termios.VMIN] = 0
        quiet[6][termios.VTIME] = 0
        termios.tcsetattr(fd, termios.TCSANOW, quiet)
        try:
            yield
        finally:
            self.pending = typed_text(self.pending, _read_waiting(fd))
            termios.tcsetattr(fd, termios.TCSANOW, saved)


def _read_waiting(fd: int) -> str:
    """Everything typed so far (the terminal is in non-blocking raw mode)."""
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


def _input_prefilled(
    prompt: str, typed_ahead: str, stdin: TextIO, write: Callable[[str], None]
) -> str | None:
    """A line read after `prompt`, starting with `typed_ahead` (editable where readline is there)."""
    if readline is None:
        write(prompt + typed_ahead)
        line = stdin.readline()
        return typed_ahead + line if line else None
    readline.set_startup_hook(lambda: readline.insert_text(typed_ahead))
    try:
        return input(prompt)
    except EOFError:
        write("\n")
        return None
    finally:
        readline.set_startup_hook(None)
