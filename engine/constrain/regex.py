"""Python `re` syntax (a subset) as a syntax tree (pattern.py), parsed by the stdlib's own parser.

Supported: literals and escapes, classes (negated too), `.` (any character but newline), `\\d`
`\\w` `\\s` with ASCII meaning ([0-9], [A-Za-z0-9_], [ \\t\\n\\r\\f\\v]), alternation, groups
(capturing or not), the quantifiers * + ? {m} {m,} {m,n} (lazy forms act as greedy), and the
anchors ^ $ \\A \\Z where nothing can come before (after) them. Anything else — backreferences,
lookaround, word boundaries, conditionals, atomic groups, possessive quantifiers, flags — raises
InvalidInput naming it. A regex constraint matches the whole output.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from engine.constrain.pattern import (
    EMPTY,
    MAX_CODE_POINT,
    SURROGATES,
    Alt,
    Anchor,
    Chars,
    Node,
    Ranges,
    Repeat,
    Seq,
    Text,
    alt,
    chars,
    complement,
    normalize,
    repeat,
    seq,
    text,
)
from engine.errors import InvalidInput

# The stdlib's own regex parser (private modules, stable since 3.11; typeshed has no stubs).
sre: Any = importlib.import_module("re._constants")
sre_parse: Any = importlib.import_module("re._parser")

FIELD = "regex"  # the input at fault, as the engine names it (service/errors.py: the request field)
ANY = ((0, MAX_CODE_POINT),)
NEWLINE = ((0x0A, 0x0A),)
DIGIT = ((0x30, 0x39),)
WORD = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
SPACE = ((0x09, 0x0D), (0x20, 0x20))
CATEGORIES = {
    sre.CATEGORY_DIGIT: DIGIT,
    sre.CATEGORY_NOT_DIGIT: complement(DIGIT),
    sre.CATEGORY_WORD: WORD,
    sre.CATEGORY_NOT_WORD: complement(WORD),
    sre.CATEGORY_SPACE: SPACE,
    sre.CATEGORY_NOT_SPACE: complement(SPACE),
}
UNSUPPORTED = {
    sre.GROUPREF: "a backreference",
    sre.GROUPREF_EXISTS: "a conditional group",
    sre.ASSERT: "a lookahead or lookbehind",
    sre.ASSERT_NOT: "a negative lookahead or lookbehind",
    sre.ATOMIC_GROUP: "an atomic group",
    sre.POSSESSIVE_REPEAT: "a possessive quantifier",
}
STARTS = (sre.AT_BEGINNING, sre.AT_BEGINNING_STRING)
ENDS = (sre.AT_END, sre.AT_END_STRING)


def parse(pattern: str, field: str = FIELD) -> Node:
    """The tree of `pattern`, anchors kept as `Anchor` nodes (see `strip_anchors`, `search`)."""
    try:
        parsed = sre_parse.parse(pattern, 0)
    except (re.error, OverflowError, RecursionError) as exc:
        raise InvalidInput(f"the regex does not parse: {exc}", reason="REGEX_INVALID", field=field) from exc
    if parsed.state.flags & ~sre.SRE_FLAG_UNICODE:
        raise _unsupported("inline flags such as (?i)", field)
    return _Converter(field).sequence(list(parsed), at_start=True, at_end=True)


def whole(pattern: str, field: str = FIELD) -> Node:
    """What a regex constraint matches: the whole output, anchors or not."""
    return strip_anchors(parse(pattern, field))


def strip_anchors(node: Node) -> Node:
    return _map_edges(node, start=lambda n: n, end=lambda n: n)


def search(node: Node, filler: Node) -> Node:
    """JSON Schema `pattern` semantics: the pattern matches somewhere unless anchored, so an
    unanchored start (end) is preceded (followed) by any run of `filler` characters."""
    run = repeat(filler, 0, None)
    return _map_edges(node, start=lambda n: seq(run, n), end=lambda n: seq(n, run))


class _Converter:
    def __init__(self, field: str) -> None:
        self.field = field

    def sequence(self, items: list[tuple[Any, Any]], at_start: bool, at_end: bool) -> Node:
        last = len(items) - 1
        return seq(
            *(
                self.item(op, av, at_start and i == 0, at_end and i == last)
                for i, (op, av) in enumerate(items)
            )
        )

    def item(self, op: Any, av: Any, at_start: bool, at_end: bool) -> Node:
        if op in UNSUPPORTED:
            raise _unsupported(UNSUPPORTED[op], self.field)
        if op == sre.LITERAL:
            return chars([(av, av)]) if SURROGATES[0] <= av <= SURROGATES[1] else text(chr(av))
        if op in (sre.NOT_LITERAL, sre.ANY, sre.IN):
            return chars(_class(op, av))
        if op == sre.BRANCH:
            return alt(*(self.sequence(list(b), at_start, at_end) for b in av[1]))
        if op == sre.SUBPATTERN:
            if av[1] or av[2]:
                raise _unsupported("scoped flags such as (?i:...)", self.field)
            return self.sequence(list(av[3]), at_start, at_end)
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
            lo, hi, body = av
            inner = self.sequence(list(body), False, False)
            return repeat(inner, lo, None if hi == sre.MAXREPEAT else hi)
        if op == sre.AT:
            return self.anchor(av, at_start, at_end)
        raise _unsupported(f"the construct {op}", self.field)

    def anchor(self, where: Any, at_start: bool, at_end: bool) -> Node:
        if where in STARTS and at_start:
            return Anchor(end=False)
        if where in ENDS and at_end:
            return Anchor(end=True)
        if where in STARTS or where in ENDS:
            raise _unsupported(f"the anchor {where} away from the pattern's edge", self.field)
        raise _unsupported(f"the assertion {where} (word boundaries and the like)", self.field)


def _class(op: Any, av: Any) -> Ranges:
    if op == sre.ANY:
        return complement(NEWLINE)
    if op == sre.NOT_LITERAL:
        return complement(((av, av),))
    ranges: list[tuple[int, int]] = []
    negate = False
    for kind, value in av:
        if kind == sre.NEGATE:
            negate = True
        elif kind == sre.LITERAL:
            ranges.append((value, value))
        elif kind == sre.RANGE:
            ranges.append(value)
        else:
            ranges.extend(CATEGORIES[value])
    merged = normalize(ranges)
    return complement(merged) if negate else merged


def _unsupported(what: str, field: str) -> InvalidInput:
    return InvalidInput(
        f"the regex uses {what}, which constraints do not support", reason="REGEX_UNSUPPORTED", field=field
    )


def _map_edges(node: Node, start: Any, end: Any) -> Node:
    """Rebuild `node`, dropping its anchors: `start(n)` wraps each leading piece that had no
    start anchor, `end(n)` each trailing piece that had no end anchor (distributed over
    alternatives and into a sequence's first and last items, which keeps the language exact)."""
    return _edge(_edge(node, start, False), end, True)


def _edge(node: Node, wrap: Any, at_end: bool) -> Node:
    if isinstance(node, Anchor):
        return EMPTY if node.end == at_end else wrap(node)
    if isinstance(node, Alt):
        return alt(*(_edge(item, wrap, at_end) for item in node.items))
    if isinstance(node, Seq) and node.items:
        items = list(node.items)
        i = -1 if at_end else 0
        items[i] = _edge(items[i], wrap, at_end)
        return seq(*items)
    return wrap(node)  # type: ignore[no-any-return]


def lengths(node: Node) -> tuple[int, int | None]:
    """The fewest and most characters a (decoded, anchor-free) tree matches (None: no most)."""
    if isinstance(node, Text):
        size = len(node.data.decode("utf-8"))
        return size, size
    if isinstance(node, Chars):
        return 1, 1
    if isinstance(node, Seq | Alt):
        parts = [lengths(item) for item in node.items]
        lows = [lo for lo, _ in parts]
        highs = [h for _, h in parts if h is not None]
        bounded = len(highs) == len(parts)
        if isinstance(node, Alt):
            return (min(lows), max(highs) if bounded else None) if parts else (0, 0)
        return sum(lows), sum(highs) if bounded else None
    if isinstance(node, Repeat) and node.separator is None:
        least, most_item = lengths(node.item)
        if node.hi is None:
            return node.lo * least, (0 if most_item == 0 else None)
        return node.lo * least, None if most_item is None else node.hi * most_item
    raise ValueError(f"no length for {type(node).__name__}")


def within(node: Node, lo: int, hi: int | None) -> Node | None:
    """`node`'s strings of lo to hi characters, where one part of it varies in length: a sequence
    of fixed-length parts and one repeat of a fixed-length item, whose count the bounds then cut
    (`^[a-z]+$` with maxLength 8 is `[a-z]{1,8}`). None where more than that varies."""
    items: list[Node] = list(node.items) if isinstance(node, Seq) else [node]
    spans = [lengths(item) for item in items]
    varying = [i for i, (least, most) in enumerate(spans) if least != most]
    if len(varying) != 1:
        return None
    k = varying[0]
    part = items[k]
    if not isinstance(part, Repeat) or part.separator is not None:
        return None
    each, most_each = lengths(part.item)
    if each != most_each or each == 0:
        return None
    fixed = sum(least for i, (least, _) in enumerate(spans) if i != k)
    fewest = max(part.lo, -(-(lo - fixed) // each))
    most = part.hi
    if hi is not None:
        most = (hi - fixed) // each if most is None else min(most, (hi - fixed) // each)
    if most is not None and fewest > most:
        return alt()
    items[k] = repeat(part.item, fewest, most)
    return seq(*items)
