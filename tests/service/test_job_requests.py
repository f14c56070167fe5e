"""Job bodies ask the scheduler through `service.worker.rounds.ask`, whose overloads type each reply (so
mypy --strict checks every use of one), never by a bare `yield` of a request."""

from __future__ import annotations

import re
from pathlib import Path

from service.worker.rounds import Feed, Token, Tokens, ask, decode_rows

SERVICE = Path(__file__).resolve().parents[2] / "service"
REQUESTS = (
    "Open",
    "Lend",
    "Prefill",
    "Choose",
    "Token",
    "Tokens",
    "Feed",
    "Fork",
    "Rewind",
    "Reset",
    "Close",
    "Stats",
    "Timed",
    "Call",
)
BARE = re.compile(r"\byield\s+(?:" + "|".join(REQUESTS) + r")\(")


def test_no_job_body_yields_a_request_without_ask() -> None:
    bare = [
        f"{path.relative_to(SERVICE.parent)}:{n}"
        for path in sorted(SERVICE.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if BARE.search(line)
    ]
    assert not bare, f"a request yielded without ask(): {bare}"


def test_ask_yields_the_request_once_and_returns_the_reply() -> None:
    row = object()
    asking = ask(Token(row))  # type: ignore[arg-type]
    assert next(asking) == Token(row)  # type: ignore[arg-type]
    try:
        asking.send(7)
    except StopIteration as done:
        assert done.value == 7
    else:
        raise AssertionError("ask returns after one reply")


def test_every_decode_request_names_its_rows() -> None:
    row, other = object(), object()
    assert decode_rows(Token(row)) == (row,)  # type: ignore[arg-type]
    assert decode_rows(Feed(row)) == (row,)  # type: ignore[arg-type]
    assert decode_rows(Tokens((row, other))) == (row, other)  # type: ignore[arg-type]
    assert decode_rows(None) == ()
