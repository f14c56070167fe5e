"""JSON text as syntax trees: strings, numbers, integer ranges, formats, literals, containers.

Whitespace policy: one optional space after `:` and after `,`, nowhere else (no space after `{`
or `[`, none before `}` or `]`, none around the whole value, no newlines): a small model cannot
loop on whitespace, and `{"a": 1, "b": [1, 2]}` and `{"a":1,"b":[1,2]}` both fit. Strings are
JSON strings: any character but `"`, `\\` and controls (U+0000-U+001F) as itself, or an escape
(\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX, no surrogate halves: one escape is one character, so
length limits count characters). Numbers are JSON numbers; an `integer` has no fraction or
exponent. Digits are bounded so a model cannot loop on them: at most 20 integer digits (an integer
without a bound in the schema: |n| < 10**20, past an unsigned 64-bit one), 20 fraction digits (a
double as Python's repr or JavaScript writes it without an exponent: 17 significant digits after
up to 4 zeros, 0.00012345678901234567), 3 exponent digits.
"""

from __future__ import annotations

import json
from fractions import Fraction
from functools import cache
from typing import Any

from engine.constrain import regex
from engine.constrain.formats import FORMATS
from engine.constrain.machines import intersection
from engine.constrain.pattern import (
    EMPTY,
    NOTHING,
    Alt,
    Chars,
    Members,
    Node,
    Repeat,
    Seq,
    Text,
    alt,
    char_set,
    chars,
    complement,
    intersect,
    optional,
    repeat,
    seq,
    subtract,
    text,
)

SPACE = optional(text(" "))
COMMA = seq(text(","), SPACE)
COLON = seq(text(":"), SPACE)
QUOTE = text('"')

NEEDS_ESCAPE = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C))
UNESCAPED = chars(complement(NEEDS_ESCAPE))  # the characters a string holds as themselves
_HEX = char_set("0123456789abcdefABCDEF")
_NOT_SURROGATE = alt(
    seq(char_set("0123456789abcABCefEF"), repeat(_HEX, 3, 3)),
    seq(char_set("dD"), char_set("01234567"), repeat(_HEX, 2, 2)),
)
ESCAPE = seq(text("\\"), alt(char_set('"\\/bfnrt'), seq(text("u"), _NOT_SURROGATE)))
CHAR = alt(UNESCAPED, ESCAPE)

MAX_INTEGER_DIGITS = 20  # an unsigned 64-bit integer's; an integer bound in the schema may say more
# Numbers with a bound or a multipleOf keep a double's exact integers (15 digits) on an open side: their
# automata grow with the width, and multipleOf's passes the grammar's limits at 20.
MAX_RANGE_DIGITS = 15
MAX_FRACTION_DIGITS = 20
MAX_EXPONENT_DIGITS = 3  # a double's exponent reaches 308

DIGIT = chars([(0x30, 0x39)])
NONZERO = chars([(0x31, 0x39)])
NATURAL = alt(text("0"), seq(NONZERO, repeat(DIGIT, 0, MAX_INTEGER_DIGITS - 1)))
INTEGER = seq(optional(text("-")), NATURAL)
NUMBER = seq(
    INTEGER,
    optional(seq(text("."), repeat(DIGIT, 1, MAX_FRACTION_DIGITS))),
    optional(seq(char_set("eE"), optional(char_set("+-")), repeat(DIGIT, 1, MAX_EXPONENT_DIGITS))),
)
BOOLEAN = alt(text("true"), text("false"))
NULL = text("null")


@cache
def string(lo: int = 0, hi: int | None = None) -> Node:
    """Strings of lo to hi characters: one node per bounds, so the pushdown engine makes the rules
    of a bound once however many properties it holds (tree_grammar.py shares a node's rules)."""
    return seq(QUOTE, repeat(CHAR, lo, hi), QUOTE)


@cache
def string_format(name: str) -> Node:
    return seq(QUOTE, in_string(regex.whole(FORMATS[name])), QUOTE)


def literal(value: Any) -> Node:
    """`value` (what an enum or const allows) with the whitespace any value may have: an object or
    an array takes one optional space after its `:` and `,` as everywhere else. A number is any
    writing of its value, as JSON Schema compares numbers (2, 2.0, 2.50 for 2.5; its exponent form)."""
    if isinstance(value, dict):
        members = [seq(literal(k), COLON, literal(v)) for k, v in value.items()]
        return seq(text("{"), *_joined(members), text("}"))
    if isinstance(value, list):
        return seq(text("["), *_joined([literal(v) for v in value]), text("]"))
    if isinstance(value, int | float) and not isinstance(value, bool):  # 2 is 2.0: equal numbers
        return alt(text(json.dumps(value)), decimal_literal(value))
    written = json.dumps(value, ensure_ascii=False)
    try:
        return text(written)
    except UnicodeEncodeError:  # a lone surrogate: keep it as its escape
        return text(json.dumps(value))


def _joined(items: list[Node]) -> list[Node]:
    out: list[Node] = []
    for i, item in enumerate(items):
        out += [COMMA, item] if i else [item]
    return out


def array(item: Node, lo: int = 0, hi: int | None = None) -> Node:
    return seq(text("["), repeat(item, lo, hi, COMMA), text("]"))


def positional_array(prefix: list[Node], rest: Node, lo: int = 0, hi: int | None = None) -> Node:
    """An array whose i-th item is `prefix[i]` and every later one `rest`, `lo` to `hi` items (an
    array may stop before the prefix ends)."""
    tail = seq(
        repeat(seq(COMMA, rest), max(lo - len(prefix), 0), None if hi is None else hi - len(prefix)),
        text("]"),
    )
    for i in reversed(range(len(prefix))):
        more = seq(COMMA if i else EMPTY, prefix[i], tail) if hi is None or i < hi else NOTHING
        tail = alt(text("]"), more) if i >= lo else more
    return seq(text("["), tail)


def object_map(value: Node, lo: int = 0, hi: int | None = None, key: Node | None = None) -> Node:
    """An object whose keys are any strings (or `key`'s), each with `value`, `lo` to `hi` of them
    (keys are not kept apart: a key written twice is one property to a parser, so `lo` above 1 is
    not a bound)."""
    return seq(
        text("{"), repeat(seq(string() if key is None else key, COLON, value), lo, hi, COMMA), text("}")
    )


def any_value(inner: Node) -> Node:
    """Any JSON value whose containers hold `inner` (a reference to this value itself: any depth)."""
    return alt(string(), NUMBER, BOOLEAN, NULL, array(inner), object_map(inner))


def integer_range(lo: int | None, hi: int | None) -> Node:
    """Integers in [lo, hi], written without leading zeros; a bound left out (None) is the largest
    of MAX_RANGE_DIGITS digits (or of as many digits as the other bound, if it has more), of
    MAX_INTEGER_DIGITS where both are."""
    least = MAX_INTEGER_DIGITS if lo is None and hi is None else MAX_RANGE_DIGITS
    widest = 10 ** max([least, *(len(str(abs(b))) for b in (lo, hi) if b is not None)]) - 1
    return _integer_range(-widest if lo is None else lo, widest if hi is None else hi)


def _integer_range(lo: int, hi: int) -> Node:
    parts = []
    if lo < 0 and min(hi, -1) >= lo:
        parts.append(seq(text("-"), natural_range(-min(hi, -1), -lo)))
    if hi >= max(lo, 0):
        parts.append(natural_range(max(lo, 0), hi))
    return alt(*parts)


ZERO_FRACTION = seq(text("."), repeat(text("0"), 1, MAX_FRACTION_DIGITS))
# A fraction with a nonzero digit: the first one after k zeros, then up to the digit limit.
NONZERO_FRACTION = alt(
    *(
        seq(text("."), repeat(text("0"), k, k), NONZERO, repeat(DIGIT, 0, MAX_FRACTION_DIGITS - k - 1))
        for k in range(MAX_FRACTION_DIGITS)
    )
)


# Exponent writings a bounded number admits where its bounds hold for all of them (json.dumps writes
# 1e-06 for 0.000001): a mantissa from 1 to below 10, times 10 to -1..-99 (a value in (0, 1)) or to
# 0..99 (from 1 up); two exponent digits at most, so no double underflows to 0 or overflows.
_MANTISSA = seq(NONZERO, optional(seq(text("."), repeat(DIGIT, 1, MAX_FRACTION_DIGITS))))
_ONE_TO_99 = alt(seq(NONZERO, optional(DIGIT)), seq(text("0"), NONZERO))
BELOW_ONE = seq(_MANTISSA, char_set("eE"), text("-"), _ONE_TO_99)
FROM_ONE = seq(_MANTISSA, char_set("eE"), optional(text("+")), repeat(DIGIT, 1, 2))


def number_range(lo: int | None, hi: int | None, lo_open: bool = False, hi_open: bool = False) -> Node:
    """Numbers x with lo <= x <= hi (lo < x, x < hi where open), integer bounds, written without an
    exponent (a bounded number's forms; `1e2` is 100 to a parser but is not among them).

    A number is its integer part and a fraction: "n.f" lies in [n, n + 1) and "-n.f" in
    (-(n + 1), -n], at the integer itself when the fraction is absent or all zeros. So the bounded
    numbers are the integers in range (with or without a zero fraction), and, for each integer m
    with lo <= m and m + 1 <= hi, the open interval (m, m + 1): m's integer part, or -(m + 1)'s for
    a negative m, with a nonzero fraction."""
    widest = 10 ** max([MAX_RANGE_DIGITS, *(len(str(abs(b))) for b in (lo, hi) if b is not None)]) - 1
    low, high = -widest if lo is None else lo, widest if hi is None else hi
    whole = _integer_range(low + (lo_open and lo is not None), high - (hi_open and hi is not None))
    parts = [seq(whole, optional(ZERO_FRACTION))] if whole != NOTHING else []
    if high - 1 >= max(low, 0):  # (m, m + 1) for m >= 0: "m.f"
        parts.append(seq(natural_range(max(low, 0), high - 1), NONZERO_FRACTION))
    if low <= min(high - 1, -1):  # (m, m + 1) for m < 0: "-(-m - 1).f"
        parts.append(seq(text("-"), natural_range(-min(high - 1, -1) - 1, -low - 1), NONZERO_FRACTION))
    return alt(*parts)


def natural_range(lo: int, hi: int) -> Node:
    """Non-negative integers in [lo, hi], one digit count at a time."""
    parts = []
    for digits in range(len(str(lo)), len(str(hi)) + 1):
        low = max(lo, 10 ** (digits - 1) if digits > 1 else 0)
        high = min(hi, 10**digits - 1)
        if low <= high:
            parts.append(_same_length(str(low), str(high)))
    return alt(*parts)


def _same_length(lo: str, hi: str) -> Node:
    if not lo:
        return EMPTY
    rest = len(lo) - 1
    if lo[1:] == "0" * rest and hi[1:] == "9" * rest:
        return seq(_digits(lo[0], hi[0]), repeat(DIGIT, rest, rest))
    if lo[0] == hi[0]:
        return seq(text(lo[0]), _same_length(lo[1:], hi[1:]))
    middle = (
        seq(_digits(chr(ord(lo[0]) + 1), chr(ord(hi[0]) - 1)), repeat(DIGIT, rest, rest))
        if ord(hi[0]) - ord(lo[0]) > 1
        else None
    )
    return alt(
        seq(text(lo[0]), _same_length(lo[1:], "9" * rest)),
        *([middle] if middle is not None else []),
        seq(text(hi[0]), _same_length("0" * rest, hi[1:])),
    )


def _digits(first: str, last: str) -> Node:
    return chars([(ord(first), ord(last))])


def plain_other_than(names: list[str]) -> Node:
    """A string's inside written without escapes (any character but `"`, `\\` and controls),
    spelling none of `names`: the complement of their trie, walked from the root."""
    trie: dict[str, Any] = {}
    for name in names:
        node = trie
        for char in name:
            node = node.setdefault(char, {})
        node[""] = {}  # a name ends here

    def other(node: dict[str, Any]) -> Node:
        # A character written escaped in a name never follows plainly: no plain string spells it.
        following = [c for c in node if c and not any(lo <= ord(c) <= hi for lo, hi in NEEDS_ESCAPE)]
        left = chars(subtract(complement(NEEDS_ESCAPE), tuple((ord(c), ord(c)) for c in following)))
        parts = [seq(left, repeat(UNESCAPED, 0, None)), *(seq(text(c), other(node[c])) for c in following)]
        if "" not in node:
            parts.append(EMPTY)
        return alt(*parts)

    return other(trie)


_SHORT_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "/": "\\/",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}


def other_than(names: list[str]) -> Node:
    """A string's inside spelling none of `names`: plain_other_than's, or any string with a short
    escape (`\\"`, `\\n`, ...) of a character none of the names holds (a key json.dumps writes
    as `"a\\"b"`). `\\uXXXX` escapes are left out of such keys (one may spell a name's character)."""
    held = set("".join(names))
    free = "".join(c for c in _SHORT_ESCAPES if c not in held)
    return alt(plain_other_than(names), _escaped(free)) if free else plain_other_than(names)


@cache
def _escaped(free: str) -> Node:
    """Strings with a short escape of one of `free`'s characters: one node per set, so a grammar
    writes it once however many objects use it."""
    return seq(repeat(CHAR, 0, None), alt(*(text(_SHORT_ESCAPES[c]) for c in free)), repeat(CHAR, 0, None))


def in_string(node: Node) -> Node:
    """A regex tree over a string's decoded characters as a tree over its JSON-escaped text:
    `"` and `\\` are written escaped; control characters in a class are left out."""
    if isinstance(node, Text):
        return text(json.dumps(node.data.decode("utf-8"), ensure_ascii=False)[1:-1])
    if isinstance(node, Chars):
        escapes = [text(e) for c, e in (('"', '\\"'), ("\\", "\\\\")) if _holds(node, ord(c))]
        return alt(chars(intersect(node.ranges, complement(NEEDS_ESCAPE))), *escapes)
    if isinstance(node, Seq):
        return seq(*(in_string(item) for item in node.items))
    if isinstance(node, Alt):
        return alt(*(in_string(item) for item in node.items))
    if isinstance(node, Repeat):
        separator = None if node.separator is None else in_string(node.separator)
        return repeat(in_string(node.item), node.lo, node.hi, separator)
    assert not isinstance(node, Members)
    return node


def _holds(node: Chars, code: int) -> bool:
    return any(lo <= code <= hi for lo, hi in node.ranges)


_ANY_FRACTION = optional(seq(text("."), repeat(DIGIT, 1, MAX_FRACTION_DIGITS)))


def decimal_range(
    lo: Fraction | None, hi: Fraction | None, lo_open: bool = False, hi_open: bool = False
) -> Node:
    """Numbers between decimal bounds (each a finite decimal of at most MAX_FRACTION_DIGITS fraction
    digits; None: unbounded), written without an exponent: each bound as the numbers on its side
    of it, compared digit by digit (_beyond), the two sides intersected as automata."""
    widest = 10 ** max([MAX_RANGE_DIGITS, *(len(str(abs(int(b)))) for b in (lo, hi) if b is not None)]) - 1
    any_natural = natural_range(0, widest)
    sides = []
    if lo is not None:  # x >= lo: from a non-negative bound, its side; else every x >= 0 and -y, y <= -lo
        sides.append(
            _beyond(lo, above=True, open_=lo_open, widest=widest)
            if lo >= 0
            else alt(
                seq(any_natural, _ANY_FRACTION),
                seq(text("-"), _beyond(-lo, above=False, open_=lo_open, widest=widest)),
            )
        )
    if hi is not None:
        negative = (
            _beyond(Fraction(0), above=True, open_=True, widest=widest)
            if hi == 0 and hi_open
            else seq(any_natural, _ANY_FRACTION)
        )  # below an open 0: not "-0"
        sides.append(
            alt(seq(text("-"), negative), _beyond(hi, above=False, open_=hi_open, widest=widest))
            if hi >= 0
            else seq(text("-"), _beyond(-hi, above=True, open_=hi_open, widest=widest))
        )
    if not sides:
        return seq(optional(text("-")), any_natural, _ANY_FRACTION)
    return sides[0] if len(sides) == 1 else intersection(sides[0], sides[1])


def _beyond(bound: Fraction, above: bool, open_: bool, widest: int) -> Node:
    """Non-negative numbers "I" or "I.F" above (or below) the non-negative `bound`, or equal to it
    unless `open_`: a larger (smaller) integer part with any fraction, or the bound's own integer
    part and a fraction beyond the bound's, compared digit by digit."""
    whole = int(bound)
    digits = _fraction_digits(bound - whole)
    beyond = (
        natural_range(whole + 1, widest) if above else natural_range(0, whole - 1) if whole > 0 else NOTHING
    )
    return alt(seq(beyond, _ANY_FRACTION), seq(text(str(whole)), _fraction_beyond(digits, above, open_)))


def _fraction_digits(fraction: Fraction) -> str:
    """The digits of a fraction in [0, 1) that is a finite decimal, without trailing zeros."""
    places = 0
    while fraction * 10**places % 1:
        places += 1
        if places > MAX_FRACTION_DIGITS:
            raise ValueError(f"a bound with more than {MAX_FRACTION_DIGITS} fraction digits")
    return str(int(fraction * 10**places)).rjust(places, "0") if places else ""


def _fraction_beyond(digits: str, above: bool, open_: bool) -> Node:
    """A number's fraction (absent, or "." and 1 to MAX_FRACTION_DIGITS digits) above (below) the
    fraction `digits` (no trailing zeros; "" is zero), or equal unless `open_`. Each form: the
    first place where the two differ, with a larger (smaller) digit there and any after; equal
    ones are `digits` followed by zeros (or nothing)."""
    zeros = repeat(text("0"), 0, MAX_FRACTION_DIGITS - max(len(digits), 1))
    equal = seq(text("."), text(digits), zeros) if digits else alt(EMPTY, seq(text("."), text("0"), zeros))
    forms: list[Node] = [] if open_ else [equal]
    for i in range(max(len(digits), 1) if not above else len(digits) + 1):
        head = seq(text("."), text(digits[:i]))
        rest = repeat(DIGIT, 0, MAX_FRACTION_DIGITS - i - 1)
        mine = int(digits[i]) if i < len(digits) else 0
        if above and i < len(digits) and mine < 9:
            forms.append(seq(head, _digits(str(mine + 1), "9"), rest))
        elif above and i == len(digits):  # past the bound's digits: zeros, then a nonzero one
            forms.append(seq(head, zeros, NONZERO, rest))
        if not above and i < len(digits) and mine > 0:
            forms.append(seq(head, _digits("0", str(mine - 1)), rest))
    if not above and digits:  # the fraction absent, or a proper prefix of the bound's digits
        forms.append(EMPTY)
        forms.extend(seq(text("."), text(digits[:i])) for i in range(1, len(digits)))
    return alt(*forms)


# A string written one way per value: characters as themselves, `"` and `\\` escaped, no control
# character (in_string's writing of a pattern): where values are ruled out by their writing.
CANONICAL_STRING = seq(QUOTE, repeat(alt(UNESCAPED, text('\\"'), text("\\\\")), 0, None), QUOTE)


def string_literal(value: str) -> Node:
    """`value` as CANONICAL_STRING writes it."""
    return seq(QUOTE, text(value.replace("\\", "\\\\").replace('"', '\\"')), QUOTE)


def decimal_literal(value: int | float) -> Node:
    """A number's writings without an exponent (`1`, `1.0`, `1.50`); NOTHING past the digit limits."""
    exact = Fraction(repr(value)) if isinstance(value, float) else Fraction(value)
    whole = abs(exact) // 1
    try:
        digits = _fraction_digits(abs(exact) - whole)
    except ValueError:
        return NOTHING
    sign = text("-") if exact < 0 else EMPTY
    zeros = repeat(text("0"), 0, MAX_FRACTION_DIGITS - len(digits))
    tail = seq(text("." + digits), zeros) if digits else optional(seq(text("."), text("0"), zeros))
    return seq(sign, text(str(whole)), tail)
