"""Code point ranges spelled as UTF-8 byte-range sequences.

`sequences(ranges)` returns sequences of byte ranges whose concatenations are exactly the UTF-8
encodings of the code points in `ranges` (surrogates must already be removed): [U+0080, U+07FF]
is [C2-DF][80-BF]. A character class thus becomes a small byte automaton, and a character split
across tokens is still walked one byte at a time. (The split is the one Russ Cox's RE2 and
Rust's utf8-ranges make.)
"""

from __future__ import annotations

from functools import lru_cache

from engine.constrain.pattern import Ranges

ByteRanges = tuple[tuple[int, int], ...]

# The last code point of each encoded length: a range never straddles one.
LENGTH_ENDS = (0x7F, 0x7FF, 0xFFFF)


@lru_cache(maxsize=1024)
def sequences(ranges: Ranges) -> tuple[ByteRanges, ...]:
    out: list[ByteRanges] = []
    for lo, hi in ranges:
        _split(lo, hi, out)
    return tuple(out)


def _split(lo: int, hi: int, out: list[ByteRanges]) -> None:
    for end in LENGTH_ENDS:
        if lo <= end < hi:
            _split(lo, end, out)
            _split(end + 1, hi, out)
            return
    if hi <= 0x7F:
        out.append(((lo, hi),))
        return
    for i in range(1, 4):
        # Split until every continuation byte below position i spans its full 80-BF range.
        mask = (1 << (6 * i)) - 1
        if lo & ~mask != hi & ~mask:
            if lo & mask:
                _split(lo, lo | mask, out)
                _split((lo | mask) + 1, hi, out)
                return
            if hi & mask != mask:
                _split(lo, (hi & ~mask) - 1, out)
                _split(hi & ~mask, hi, out)
                return
    first, last = chr(lo).encode("utf-8"), chr(hi).encode("utf-8")
    out.append(tuple(zip(first, last, strict=True)))
