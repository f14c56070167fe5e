"""JSON text as syntax trees: strings, numbers, integer ranges, formats, literals, containers.

Whitespace policy: one optional space after `:` and after `,`, nowhere else (no space after `{`
or `[`, none before `}` or `]`, none around the whole value, no newlines): a small model cannot
loop on whitespace, and `{"a": 1, "b": [1, 2]}` and `{"a":1,"b":[1,2]}` both fit. Strings are
JSON strings: any character but `"`, `\\` and controls (U+0000-U+001F) as itself, or an escape
(\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX, no surrogate halves: one escape is one character, so
length limits count characters). Numbers are JSON numbers; an `integer` has no fraction or
exponent. Digits are bounded so a model cannot loop on them: at most 15 integer digits (an integer
without a bound in the schema: |n| <= 999,999,999,999,999), 15 fraction digits, 3 exponent digits.
"""

from __future__ import annotations

import json
from fractions import Fraction
from functools import cache
from typing import Any

import numpy as np

from engine.constrain import dfa, nfa, regex
from engine.constrain.budget import UNBOUNDED, Budget
from engine.constrain.pattern import (
    EMPTY,
    NOTHING,
    Alt,
    Chars,
    Machine,
    Members,
    Node,
    Ref,
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
_NOT_SURROGATE = alt(seq(char_set("0123456789abcABCefEF"), repeat(_HEX, 3, 3)),
                     seq(char_set("dD"), char_set("01234567"), repeat(_HEX, 2, 2)))
ESCAPE = seq(text("\\"), alt(char_set('"\\/bfnrt'), seq(text("u"), _NOT_SURROGATE)))
CHAR = alt(UNESCAPED, ESCAPE)

MAX_INTEGER_DIGITS = 15  # what a double holds exactly; an integer bound in the schema may say more
MAX_FRACTION_DIGITS = 15
MAX_EXPONENT_DIGITS = 3  # a double's exponent reaches 308

DIGIT = chars([(0x30, 0x39)])
NONZERO = chars([(0x31, 0x39)])
NATURAL = alt(text("0"), seq(NONZERO, repeat(DIGIT, 0, MAX_INTEGER_DIGITS - 1)))
INTEGER = seq(optional(text("-")), NATURAL)
NUMBER = seq(INTEGER, optional(seq(text("."), repeat(DIGIT, 1, MAX_FRACTION_DIGITS))),
             optional(seq(char_set("eE"), optional(char_set("+-")), repeat(DIGIT, 1, MAX_EXPONENT_DIGITS))))
BOOLEAN = alt(text("true"), text("false"))
NULL = text("null")

_DATE = (r"\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)"
         r"|02-(?:0[1-9]|1\d|2[0-8]))")
_TIME = r"(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,6})?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)"
_ATOM = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
# A DNS label (RFC 1123): letters, digits and inner hyphens, 63 at most; none with hyphens 3rd and 4th
# (RFC 5891: "xn--" starts an A-label, whose Punycode a regex cannot check; the others are reserved).
_LABEL = (r"[A-Za-z0-9](?:[A-Za-z0-9-]?[A-Za-z0-9])?"
          r"|[A-Za-z0-9][A-Za-z0-9-](?:[A-Za-z0-9][A-Za-z0-9-]{0,59}[A-Za-z0-9]|-[A-Za-z0-9](?:[A-Za-z0-9-]{0,58}[A-Za-z0-9])?)")
_LABEL = f"(?:{_LABEL})"
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
# RFC 3986's grammar: scheme, authority (userinfo, host, port), path, query and fragment, each of
# the characters it may hold (%HH escapes well formed), an IP literal an IPv6 address (or IPvFuture).
# An IRI (RFC 3987) adds the non-ASCII characters it allows.
_SCHEME = r"[A-Za-z][A-Za-z0-9+.-]*"
_H16 = r"[0-9A-Fa-f]{1,4}"
_IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_LS32 = f"(?:{_H16}:{_H16}|{_IPV4})"
_IPV6 = "|".join([
    f"(?:{_H16}:){{6}}{_LS32}", f"::(?:{_H16}:){{5}}{_LS32}", f"(?:{_H16})?::(?:{_H16}:){{4}}{_LS32}",
    f"(?:(?:{_H16}:){{0,1}}{_H16})?::(?:{_H16}:){{3}}{_LS32}",
    f"(?:(?:{_H16}:){{0,2}}{_H16})?::(?:{_H16}:){{2}}{_LS32}",
    f"(?:(?:{_H16}:){{0,3}}{_H16})?::{_H16}:{_LS32}", f"(?:(?:{_H16}:){{0,4}}{_H16})?::{_LS32}",
    f"(?:(?:{_H16}:){{0,5}}{_H16})?::{_H16}", f"(?:(?:{_H16}:){{0,6}}{_H16})?::"])
_UCS = "\u00a0-\ud7ff\uf900-\ufdcf\ufdf0-\uffef"


def _uri(reference: bool, iri: bool) -> str:
    unreserved = "A-Za-z0-9\\-._~" + (_UCS if iri else "")
    plain = f"(?:[{unreserved}!$&'()*+,;=]|%[0-9A-Fa-f]{{2}})"  # unreserved, sub-delims, %HH
    pchar = f"(?:{plain}|[:@])"
    segment, nonempty = f"{pchar}*", f"{pchar}+"
    literal = f"\\[(?:{_IPV6}|v[0-9A-Fa-f]+\\.(?:{plain}|:)+)\\]"  # an IP literal: IPv6 or IPvFuture
    authority = f"(?:(?:{plain}|:)*@)?(?:{literal}|{plain}*)(?::\\d*)?"
    after = f"(?:\\?(?:{pchar}|[/?])*)?(?:#(?:{pchar}|[/?])*)?"
    hier = f"(?://{authority}(?:/{segment})*|/(?:{nonempty}(?:/{segment})*)?|{nonempty}(?:/{segment})*|)"
    absolute = f"{_SCHEME}:{hier}{after}"
    if not reference:
        return absolute
    no_colon = f"(?:{plain}|@)+"  # a relative path's first segment holds no ":" (it would be a scheme)
    relative = f"(?://{authority}(?:/{segment})*|/(?:{nonempty}(?:/{segment})*)?|{no_colon}(?:/{segment})*|){after}"
    return f"(?:{absolute}|{relative})"


# RFC 6570: literal characters and {expressions} of an optional operator and variables.
_VARNAME = r"(?:[A-Za-z0-9_]|%[0-9A-Fa-f]{2})(?:\.?(?:[A-Za-z0-9_]|%[0-9A-Fa-f]{2}))*"
_VARSPEC = f"{_VARNAME}(?::[1-9]\\d{{0,3}}|\\*)?"
_URI_TEMPLATE = (f"(?:[!#$&()*+,\\-./0-9:;=?@A-Z\\[\\]_a-z~{_UCS}]|%[0-9A-Fa-f]{{2}}"
                 f"|\\{{[+#./;?&=,!@|]?{_VARSPEC}(?:,{_VARSPEC})*\\}})*")
_DURATION_TIME = r"T(?:\d+H(?:\d+M(?:\d+S)?)?|\d+M(?:\d+S)?|\d+S)"
_DURATION = rf"P(?:(?:\d+D|\d+M(?:\d+D)?|\d+Y(?:\d+M(?:\d+D)?)?)(?:{_DURATION_TIME})?|{_DURATION_TIME}|\d+W)"
# February stops at the 28th and seconds at 59: every date written is a real one, in any year.
FORMATS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}T{_TIME}",
    "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}",
    "email": rf"{_ATOM}(?:\.{_ATOM})*@{_LABEL}(?:\.{_LABEL})+",
    "ipv4": _IPV4,
    "hostname": rf"{_LABEL}(?:\.{_LABEL})*",
    "ipv6": _IPV6,
    "uri": _uri(reference=False, iri=False),
    "uri-reference": _uri(reference=True, iri=False),
    "iri": _uri(reference=False, iri=True),
    "iri-reference": _uri(reference=True, iri=True),
    "uri-template": _URI_TEMPLATE,
    "duration": _DURATION,
}


# Each format's shortest and longest string in characters (None: no longest); all are ASCII.
FORMAT_LENGTHS: dict[str, tuple[int, int | None]] = {
    "date": (10, 10),
    "time": (9, 21),  # 12:00:00Z .. 12:00:00.123456+01:00
    "date-time": (20, 32),
    "uuid": (36, 36),
    "email": (5, None),  # a@b.c
    "ipv4": (7, 15),
    "hostname": (1, None),
    "ipv6": (2, 45),  # :: .. ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255
    "uri": (2, None),  # a:
    "uri-reference": (0, None),
    "iri": (2, None),
    "iri-reference": (0, None),
    "uri-template": (0, None),
    "duration": (3, None),  # P1D
}


def string(lo: int = 0, hi: int | None = None) -> Node:
    return seq(QUOTE, repeat(CHAR, lo, hi), QUOTE)


@cache
def string_format(name: str) -> Node:
    return seq(QUOTE, regex.whole(FORMATS[name]), QUOTE)


def literal(value: Any) -> Node:
    """`value` (what an enum or const allows) with the whitespace any value may have: an object or
    an array takes one optional space after its `:` and `,` as everywhere else."""
    if isinstance(value, dict):
        members = [seq(literal(k), COLON, literal(v)) for k, v in value.items()]
        return seq(text("{"), *_joined(members), text("}"))
    if isinstance(value, list):
        return seq(text("["), *_joined([literal(v) for v in value]), text("]"))
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
    tail = seq(repeat(seq(COMMA, rest), max(lo - len(prefix), 0),
                      None if hi is None else hi - len(prefix)), text("]"))
    for i in reversed(range(len(prefix))):
        more = seq(COMMA if i else EMPTY, prefix[i], tail) if hi is None or i < hi else NOTHING
        tail = alt(text("]"), more) if i >= lo else more
    return seq(text("["), tail)


def object_map(value: Node, lo: int = 0, hi: int | None = None, key: Node | None = None) -> Node:
    """An object whose keys are any strings (or `key`'s), each with `value`, `lo` to `hi` of them
    (keys are not kept apart: a key written twice is one property to a parser, so `lo` above 1 is
    not a bound)."""
    return seq(text("{"), repeat(seq(string() if key is None else key, COLON, value), lo, hi, COMMA),
               text("}"))


def any_value(inner: Node) -> Node:
    """Any JSON value whose containers hold `inner` (a reference to this value itself: any depth)."""
    return alt(string(), NUMBER, BOOLEAN, NULL, array(inner), object_map(inner))


def integer_range(lo: int | None, hi: int | None) -> Node:
    """Integers in [lo, hi], written without leading zeros; a bound left out (None) is the largest
    of MAX_INTEGER_DIGITS digits (or of as many digits as the other bound, if it has more)."""
    widest = 10 ** max([MAX_INTEGER_DIGITS, *(len(str(abs(b))) for b in (lo, hi) if b is not None)]) - 1
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
NONZERO_FRACTION = alt(*(seq(text("."), repeat(text("0"), k, k), NONZERO,
                             repeat(DIGIT, 0, MAX_FRACTION_DIGITS - k - 1))
                         for k in range(MAX_FRACTION_DIGITS)))


def number_range(lo: int | None, hi: int | None, lo_open: bool = False, hi_open: bool = False) -> Node:
    """Numbers x with lo <= x <= hi (lo < x, x < hi where open), integer bounds, written without an
    exponent (a bounded number's forms; `1e2` is 100 to a parser but is not among them).

    A number is its integer part and a fraction: "n.f" lies in [n, n + 1) and "-n.f" in
    (-(n + 1), -n], at the integer itself when the fraction is absent or all zeros. So the bounded
    numbers are the integers in range (with or without a zero fraction), and, for each integer m
    with lo <= m and m + 1 <= hi, the open interval (m, m + 1): m's integer part, or -(m + 1)'s for
    a negative m, with a nonzero fraction."""
    widest = 10 ** max([MAX_INTEGER_DIGITS, *(len(str(abs(b))) for b in (lo, hi) if b is not None)]) - 1
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
    middle = (seq(_digits(chr(ord(lo[0]) + 1), chr(ord(hi[0]) - 1)), repeat(DIGIT, rest, rest))
              if ord(hi[0]) - ord(lo[0]) > 1 else None)
    return alt(seq(text(lo[0]), _same_length(lo[1:], "9" * rest)),
               *([middle] if middle is not None else []),
               seq(text(hi[0]), _same_length("0" * rest, hi[1:])))


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


MAX_MULTIPLE_STATES = 20_000  # a multipleOf's machine: the number's states times the remainders


def multiples(number: Node, numerator: int, places: int, budget: Budget = UNBOUNDED) -> Node:
    """The strings of `number` (digits, at most one `.`, an optional `-`; no exponent) whose value
    is a multiple of numerator / 10**places: the number's DFA walked beside the remainder, mod
    `numerator`, of its digits read as one integer with the fraction padded to `places` digits.
    Past `places` fraction digits only zeros are written. nfa.TooLarge past MAX_MULTIPLE_STATES."""
    table = dfa.determinize(nfa.build(number, MAX_MULTIPLE_STATES, budget), MAX_MULTIPLE_STATES)
    moves = [[(byte, target) for byte, target in enumerate(row) if target != dfa.DEAD]
             for row in table.table.tolist()]
    ends = table.accepting.tolist()
    start = (dfa.START, 0, -1)  # (number's state, remainder, fraction digits so far: -1 before ".")
    ids, order = {start: 0}, [start]
    edges: list[list[tuple[int, int, int]]] = []  # per state: (byte, byte, target)
    while len(edges) < len(order):
        budget.tick()
        state, rest, fraction = order[len(edges)]
        out = []
        for byte, target in moves[state]:
            if 0x30 <= byte <= 0x39 and fraction < places:
                after = (target, (rest * 10 + byte - 0x30) % numerator, fraction + (fraction >= 0))
            elif 0x30 <= byte <= 0x39:
                if byte != 0x30:
                    continue
                after = (target, rest, fraction)
            else:
                after = (target, rest, 0 if byte == ord(".") else fraction)
            if after not in ids:
                if len(order) >= MAX_MULTIPLE_STATES:
                    raise nfa.TooLarge(f"more than {MAX_MULTIPLE_STATES} states for a multipleOf")
                ids[after] = len(order)
                order.append(after)
            out.append((byte, byte, ids[after]))
        edges.append(out)
    accepting = [ends[state] and rest * pow(10, places - max(fraction, 0), numerator) % numerator == 0
                 for state, rest, fraction in order]
    return machine(edges, accepting)


def machine(edges: list[list[tuple[int, int, int]]], accepting: list[bool]) -> Node:
    """A Machine of the states that can reach an accepting one (state 0 the start; NOTHING where it
    cannot); `edges[s]`: (first byte, last byte, target), adjacent ranges to one target joined."""
    before: list[list[int]] = [[] for _ in edges]
    for state, out in enumerate(edges):
        for _, _, target in out:
            before[target].append(state)
    live = list(accepting)
    stack = [state for state, ends in enumerate(accepting) if ends]
    while stack:
        for state in before[stack.pop()]:
            if not live[state]:
                live[state] = True
                stack.append(state)
    if not live[0]:
        return NOTHING
    kept = [state for state in range(len(edges)) if live[state]]
    index = {state: i for i, state in enumerate(kept)}
    moves = []
    for state in kept:
        ranges: list[tuple[int, int, int]] = []
        for lo, hi, target in sorted(edges[state]):
            if not live[target]:
                continue
            if ranges and ranges[-1][1] == lo - 1 and ranges[-1][2] == index[target]:
                ranges[-1] = (ranges[-1][0], hi, index[target])
            else:
                ranges.append((lo, hi, index[target]))
        moves.append(tuple(ranges))
    return Machine(tuple(moves), tuple(accepting[state] for state in kept))


_ANY_FRACTION = optional(seq(text("."), repeat(DIGIT, 1, MAX_FRACTION_DIGITS)))


def decimal_range(lo: Fraction | None, hi: Fraction | None, lo_open: bool = False,
                  hi_open: bool = False) -> Node:
    """Numbers between decimal bounds (each a finite decimal of at most MAX_FRACTION_DIGITS fraction
    digits; None: unbounded), written without an exponent: each bound as the numbers on its side
    of it, compared digit by digit (_beyond), the two sides intersected as automata."""
    widest = 10 ** max([MAX_INTEGER_DIGITS, *(len(str(abs(int(b)))) for b in (lo, hi) if b is not None)]) - 1
    any_natural = natural_range(0, widest)
    sides = []
    if lo is not None:  # x >= lo: from a non-negative bound, its side; else every x >= 0 and -y, y <= -lo
        sides.append(_beyond(lo, above=True, open_=lo_open, widest=widest) if lo >= 0 else
                     alt(seq(any_natural, _ANY_FRACTION),
                         seq(text("-"), _beyond(-lo, above=False, open_=lo_open, widest=widest))))
    if hi is not None:
        negative = (_beyond(Fraction(0), above=True, open_=True, widest=widest) if hi == 0 and hi_open
                    else seq(any_natural, _ANY_FRACTION))  # below an open 0: not "-0"
        sides.append(alt(seq(text("-"), negative), _beyond(hi, above=False, open_=hi_open, widest=widest))
                     if hi >= 0 else
                     seq(text("-"), _beyond(-hi, above=True, open_=hi_open, widest=widest)))
    if not sides:
        return seq(optional(text("-")), any_natural, _ANY_FRACTION)
    return sides[0] if len(sides) == 1 else intersection(sides[0], sides[1])


def _beyond(bound: Fraction, above: bool, open_: bool, widest: int) -> Node:
    """Non-negative numbers "I" or "I.F" above (or below) the non-negative `bound`, or equal to it
    unless `open_`: a larger (smaller) integer part with any fraction, or the bound's own integer
    part and a fraction beyond the bound's, compared digit by digit."""
    whole = int(bound)
    digits = _fraction_digits(bound - whole)
    beyond = (natural_range(whole + 1, widest) if above else
              natural_range(0, whole - 1) if whole > 0 else NOTHING)
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


def difference(first: Node, second: Node, budget: Budget = UNBOUNDED) -> Node:
    """The strings `first` matches and `second` does not, as a Machine."""
    return _product(first, second, budget, keep_dead=True, accepts=lambda a, b: a and not b)


def intersection(first: Node, second: Node, budget: Budget = UNBOUNDED) -> Node:
    """The strings both nodes match, as a Machine: their DFAs walked side by side.
    nfa.TooLarge past MAX_MULTIPLE_STATES states."""
    return _product(first, second, budget, keep_dead=False, accepts=lambda a, b: a and b)


def _product(first: Node, second: Node, budget: Budget, keep_dead: bool, accepts: Any) -> Node:
    """Both DFAs walked side by side (the second's dead state kept where `keep_dead`), a pair
    accepting as `accepts(first accepts, second accepts)` says; bytes that neither DFA tells
    apart are walked once, as one class."""
    tables = [dfa.determinize(nfa.build(node, MAX_MULTIPLE_STATES, budget), MAX_MULTIPLE_STATES)
              for node in (first, second)]
    kinds = [np.unique(t.table.T, axis=0, return_inverse=True)[1].ravel() for t in tables]
    joint, representative, of_byte = np.unique(kinds[0] * (int(kinds[1].max()) + 1) + kinds[1],
                                               return_index=True, return_inverse=True)
    ranges: list[list[tuple[int, int]]] = [[] for _ in joint]  # each class's bytes, as ranges
    for byte, kind in enumerate(of_byte.ravel().tolist()):
        if ranges[kind] and ranges[kind][-1][1] == byte - 1:
            ranges[kind][-1] = (ranges[kind][-1][0], byte)
        else:
            ranges[kind].append((byte, byte))
    columns = [t.table[:, representative].tolist() for t in tables]  # [state][class] -> next
    start = (dfa.START, dfa.START)
    ids, order = {start: 0}, [start]
    edges: list[list[tuple[int, int, int]]] = []
    while len(edges) < len(order):
        budget.tick()
        a, b = order[len(edges)]
        out: list[tuple[int, int, int]] = []
        for kind, (target, other) in enumerate(zip(columns[0][a], columns[1][b], strict=True)):
            if target == dfa.DEAD or other == dfa.DEAD and not keep_dead:
                continue
            pair = (target, other)
            if pair not in ids:
                if len(order) >= MAX_MULTIPLE_STATES:
                    raise nfa.TooLarge(f"more than {MAX_MULTIPLE_STATES} states for an intersection")
                ids[pair] = len(order)
                order.append(pair)
            out.extend((lo, hi, ids[pair]) for lo, hi in ranges[kind])
        edges.append(out)
    ends = [table.accepting.tolist() for table in tables]
    return machine(edges, [accepts(ends[0][a], ends[1][b]) for a, b in order])


def matches(node: Node, data: bytes, budget: Budget = UNBOUNDED) -> bool:
    """Whether `node` (a tree without Ref: one automaton) matches `data`, by its DFA (nfa.TooLarge
    past MAX_MULTIPLE_STATES states)."""
    table = dfa.determinize(nfa.build(node, MAX_MULTIPLE_STATES, budget), MAX_MULTIPLE_STATES)
    state = dfa.START
    for byte in data:
        state = int(table.table[state, byte])
        if state == dfa.DEAD:
            return False
    return bool(table.accepting[state])


def refers(node: Node, seen: set[int] | None = None) -> bool:
    """Whether a tree holds a Ref (then only the pushdown engine runs it)."""
    seen = set() if seen is None else seen
    if id(node) in seen:
        return False
    seen.add(id(node))
    if isinstance(node, Ref):
        return True
    if isinstance(node, Seq | Alt | Members):
        return any(refers(item, seen) for item in node.items) or (
            isinstance(node, Members) and refers(node.separator, seen))
    if isinstance(node, Repeat):
        return refers(node.item, seen) or node.separator is not None and refers(node.separator, seen)
    return False
