"""The synthetic byte-level vocabulary the constraint tests share: every single byte (token id b is
byte b), some multi-byte pieces (a few split mid-character), an EOS id, a special id and padding ids."""

from __future__ import annotations

from collections.abc import Sequence

from engine.constrain import Vocabulary

PIECES = [bytes([b]) for b in range(256)] + [
    b"ab",
    b"abc",
    b"caf",
    "é".encode(),
    b"\xc3",
    b"\xa9",
    "日".encode()[:2],
    "日".encode()[2:],
    "本".encode(),
    b'{"',
    b'":',
    b'", "',
    b'"}',
    b"true",
    b"null",
    b"12",
    b"-0",
    b" the",
    b"\\u00",
]
EOS, SPECIAL = len(PIECES), len(PIECES) + 1
SIZE = len(PIECES) + 4  # two padding ids past the tokenizer's table


def synthetic(pieces: Sequence[bytes | None] = PIECES) -> Vocabulary:
    return Vocabulary([*pieces, b"</s>", None], len(pieces) + 4, [len(pieces)])


VOCAB = synthetic()
