"""GBNF, llama.cpp's grammar notation, parsed and checked into a Program: the rules flattened
into one array of elements. Every error is InvalidInput with the line and column at fault. The
checks on the parsed rules, and the elements rules are made of, are gbnf_rules.py's.

Notation. A grammar is rules `name ::= alternatives`; the start rule is `root`. Names are
`[A-Za-z0-9_-]+`. Alternatives are separated by `|`; a sequence is items one after another:
  "text"      a literal; escapes \\n \\t \\r \\\\ \\" \\[ \\] \\- \\xNN \\uNNNN \\UNNNNNNNN (code points)
  [a-z_]      a character class, `[^...]` its complement; the same escapes; `-` first or last is itself
  .           any character
  name        a rule;  ( ... ) a group
  X* X+ X?    repetition, and X{m} X{m,} X{m,n} (bounds on the item just before)
`#` starts a comment to the end of the line. Newlines are whitespace: a rule runs on until the next
`name ::=`. Not supported: llama.cpp's token references `<[id]>` and `{,n}`.

Characters are their UTF-8 bytes and classes byte sequences, so every terminal is a byte mask.
Rejected (reason GRAMMAR_INVALID): syntax errors, an undefined rule, a missing root, a rule
defined twice, left recursion (direct, indirect or through rules that can be empty, as llama.cpp
rejects it), a rule that matches no finite text; past the element bound, CONSTRAINT_TOO_LARGE.
Repetitions become rules, as llama.cpp rewrites them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NoReturn

from engine.constrain.gbnf_rules import END, REF, TERMINAL, Alternative, checked_bodies
from engine.constrain.pattern import MAX_CODE_POINT, SURROGATES, Rules, complement, normalize, subtract
from engine.constrain.utf8 import ByteRanges, sequences
from engine.errors import InvalidInput

__all__ = [
    "END",
    "FIELD",
    "MAX_ELEMENTS",
    "REF",
    "TERMINAL",
    "Program",
    "Stack",
    "byte_alternatives",
    "flatten",
    "parse",
]

FIELD = "grammar"  # the input at fault, as the engine names it (service/errors.py: the request field)
MAX_ELEMENTS = 1 << 16  # elements of the compiled rules, repetitions expanded
MAX_NESTING = 64  # parenthesized groups within one another (the parser recurses)

Stack = tuple[int, ...]
Ranges = list[tuple[int, int]]

SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-"}
HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}


def parse(text: str, max_elements: int = MAX_ELEMENTS) -> Program:
    """The checked, flattened rules of GBNF `text`; InvalidInput says what is wrong and where."""
    rules = _Parser(text, max_elements).parse()
    return flatten(checked_bodies(rules), rules.ids["root"])


def _invalid(text: str, offset: int, message: str, reason: str = "GRAMMAR_INVALID") -> InvalidInput:
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return InvalidInput(f"grammar, line {line} column {column}: {message}", reason=reason, field=FIELD)


class _Rules:
    """Rules as they are parsed: bodies by id, and where each was defined (or first used)."""

    def __init__(self, text: str, max_elements: int) -> None:
        self.text, self.max_elements, self.elements = text, max_elements, 0
        self.ids: dict[str, int] = {}
        self.names: list[str] = []
        self.bodies: list[list[Alternative] | None] = []
        self.offsets: list[int] = []
        self.repeats: set[int] = set()  # rules a repetition made
        self.classes: dict[tuple[tuple[int, int], ...], Alternative] = {}

    def invalid(self, offset: int, message: str) -> InvalidInput:
        return _invalid(self.text, offset, message)

    def use(self, name: str, offset: int) -> int:
        if name not in self.ids:
            self.ids[name] = self.new(name, None, offset)
        return self.ids[name]

    def define(self, name: str, body: list[Alternative], offset: int) -> None:
        rule = self.use(name, offset)
        if self.bodies[rule] is not None:
            raise _invalid(self.text, offset, f"rule '{name}' is defined twice")
        self.charge(sum(len(alt) + 1 for alt in body), offset)
        self.bodies[rule], self.offsets[rule] = body, offset

    def new(self, name: str, body: list[Alternative] | None, offset: int) -> int:
        if body is not None:
            self.charge(sum(len(alt) + 1 for alt in body), offset)
        self.names.append(name)
        self.bodies.append(body)
        self.offsets.append(offset)
        return len(self.names) - 1

    def synthetic(self, parent: str, body: list[Alternative], offset: int) -> int:
        return self.new(f"{parent}_{len(self.names)}", body, offset)

    def charge(self, elements: int, offset: int) -> None:
        self.fits(elements, offset)
        self.elements += elements

    def fits(self, elements: int, offset: int) -> None:
        if self.elements + elements > self.max_elements:
            raise _invalid(
                self.text,
                offset,
                f"more than {self.max_elements} elements once repetitions are expanded",
                reason="CONSTRAINT_TOO_LARGE",
            )

    def repetition(
        self, parent: str, item: Alternative, low: int, high: int | None, offset: int
    ) -> Alternative:
        """X{low,high} as llama.cpp rewrites it: X repeated low times, then nested optional rules
        (X (X (X)?)?) up to high, or one right-recursive rule (R ::= X R | ) when unbounded."""
        self.fits(len(item) * (low + (high - low if high is not None else 1)), offset)
        tail: Alternative = []
        for _ in range(1 if high is None else high - low):
            rule = self.synthetic(parent, [item + tail, []], offset)
            self.repeats.add(rule)
            tail = [(REF, rule)]
        if high is None:  # the one rule refers to itself: R ::= X R |
            self.bodies[tail[0][1]] = [item + tail, []]
        return item * low + tail

    def char_class(self, parent: str, ranges: Ranges, offset: int) -> Alternative:
        """A set of code points as UTF-8 byte sequences: one element, or a rule of alternatives."""
        key = subtract(normalize(ranges), (SURROGATES,))
        if key not in self.classes:
            alts = byte_alternatives(sequences(key), lambda body: self.synthetic(parent, body, offset))
            self.classes[key] = alts[0] if len(alts) == 1 else [(REF, self.synthetic(parent, alts, offset))]
        return self.classes[key]


class _Parser:
    """Recursive descent over GBNF text into _Rules."""

    def __init__(self, text: str, max_elements: int) -> None:
        self.text, self.pos, self.depth = text, 0, 0
        self.rules = _Rules(text, max_elements)

    def fail(self, message: str, offset: int | None = None) -> NoReturn:
        raise _invalid(self.text, self.pos if offset is None else offset, message)

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def skip_space(self) -> None:
        while self.pos < len(self.text):
            if self.text[self.pos] == "#":
                end = self.text.find("\n", self.pos)
                self.pos = len(self.text) if end < 0 else end
            elif self.text[self.pos] in " \t\r\n":
                self.pos += 1
            else:
                return

    def parse(self) -> _Rules:
        self.skip_space()
        while self.pos < len(self.text):
            self.rule()
        return self.rules

    def rule(self) -> None:
        start = self.pos
        name = self.name() or self.fail("expected a rule name")
        self.skip_space()
        if not self.text.startswith("::=", self.pos):
            self.fail(f"expected '::=' after '{name}'")
        self.pos += 3
        self.skip_space()
        self.rules.define(name, self.alternatives(name), start)
        if self.pos < len(self.text) and not _is_name_char(self.peek()):
            self.fail(f"unexpected '{self.peek()}'")

    def name(self) -> str:
        start = self.pos
        while _is_name_char(self.peek()):
            self.pos += 1
        return self.text[start : self.pos]

    def at_rule_start(self) -> bool:
        """Whether a name followed by '::=' is next: the current rule ends there."""
        saved = self.pos
        self.name()
        self.skip_space()
        found = self.text.startswith("::=", self.pos)
        self.pos = saved
        return found

    def alternatives(self, rule: str) -> list[Alternative]:
        alts = [self.sequence(rule)]
        while self.peek() == "|":
            self.pos += 1
            self.skip_space()
            alts.append(self.sequence(rule))
        return alts

    def sequence(self, rule: str) -> Alternative:
        out: Alternative = []
        while (item := self.item(rule)) is not None:
            self.skip_space()
            while self.peek() and self.peek() in "*+?{":
                item = self.repeat(rule, item)
                self.skip_space()
            out.extend(item)
        return out

    def item(self, rule: str) -> Alternative | None:
        char, start = self.peek(), self.pos
        if char == '"':
            return self.literal()
        if char == "[":
            return self.rules.char_class(rule, self.char_class(), start)
        if char == ".":
            self.pos += 1
            return self.rules.char_class(rule, [(0, MAX_CODE_POINT)], start)
        if char == "(":
            return self.group(rule)
        if char and char in "*+?{":
            self.fail(f"'{char}' has nothing before it to repeat")
        if _is_name_char(char) and not self.at_rule_start():
            return [(REF, self.rules.use(self.name(), start))]
        return None

    def group(self, rule: str) -> Alternative:
        start = self.pos
        if self.depth == MAX_NESTING:
            self.fail(f"groups nested deeper than {MAX_NESTING}")
        self.pos, self.depth = self.pos + 1, self.depth + 1
        self.skip_space()
        alts = self.alternatives(rule)
        if self.peek() != ")":
            self.fail("expected ')' to close the group opened", start)
        self.pos, self.depth = self.pos + 1, self.depth - 1
        return alts[0] if len(alts) == 1 else [(REF, self.rules.synthetic(rule, alts, start))]

    def repeat(self, rule: str, item: Alternative) -> Alternative:
        start, char = self.pos, self.peek()
        self.pos += 1
        low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}.get(char) or self.bounds(start)
        return self.rules.repetition(rule, item, low, high, start) if item else item

    def bounds(self, start: int) -> tuple[int, int | None]:
        self.skip_space()
        low = self.integer()
        high: int | None = low
        self.skip_space()
        if self.peek() == ",":
            self.pos += 1
            self.skip_space()
            high = self.integer() if self.peek().isdigit() else None
            self.skip_space()
        if self.peek() != "}":
            self.fail("expected '}' to close the repetition opened", start)
        self.pos += 1
        if high is not None and high < low:
            self.fail(f"repetition {{{low},{high}}} has its maximum below its minimum", start)
        return low, high

    def integer(self) -> int:
        start = self.pos
        while self.peek().isascii() and self.peek().isdigit():
            self.pos += 1
        if start == self.pos or self.pos - start > 9:
            self.fail("expected a repetition count (at most 9 digits)", start)
        return int(self.text[start : self.pos])

    def literal(self) -> Alternative:
        start = self.pos
        self.pos += 1
        out: Alternative = []
        while self.peek() != '"':
            if not self.peek():
                self.fail("unterminated string", start)
            out.extend((TERMINAL, 1 << byte) for byte in chr(self.char()).encode())
        self.pos += 1
        return out

    def char_class(self) -> Ranges:
        start = self.pos
        self.pos += 1
        negated = self.peek() == "^"
        self.pos += negated
        ranges: Ranges = []
        while self.peek() != "]":
            if not self.peek():
                self.fail("unterminated character class", start)
            at, low = self.pos, self.char()
            high = low
            if self.peek() == "-" and self.text[self.pos + 1 : self.pos + 2] not in ("]", ""):
                self.pos += 1
                high = self.char()
                if high < low:
                    self.fail("character range ends before it starts", at)
            ranges.append((low, high))
        self.pos += 1
        return list(complement(normalize(ranges))) if negated else ranges

    def char(self) -> int:
        """One code point, escapes decoded."""
        start = self.pos
        if self.peek() == "\\":
            code = self.escape()
        else:
            code, self.pos = ord(self.peek()), self.pos + 1
        if code > MAX_CODE_POINT or SURROGATES[0] <= code <= SURROGATES[1]:
            self.fail(f"U+{code:04X} is not a character", start)
        return code

    def escape(self) -> int:
        escape = self.text[self.pos + 1 : self.pos + 2]
        if escape in SIMPLE_ESCAPES:
            self.pos += 2
            return ord(SIMPLE_ESCAPES[escape])
        if escape not in HEX_ESCAPES:
            self.fail(f"unknown escape '\\{escape}'")
        digits = self.text[self.pos + 2 : self.pos + 2 + HEX_ESCAPES[escape]]
        if len(digits) != HEX_ESCAPES[escape] or any(c not in "0123456789abcdefABCDEF" for c in digits):
            self.fail(f"'\\{escape}' needs {HEX_ESCAPES[escape]} hex digits")
        self.pos += 2 + len(digits)
        return int(digits, 16)


def _is_name_char(char: str) -> bool:
    return bool(char) and char.isascii() and (char.isalnum() or char in "_-")


def byte_alternatives(
    byte_sequences: Iterable[ByteRanges], new_rule: Callable[[list[Alternative]], int]
) -> list[Alternative]:
    """Byte-range sequences as alternatives that share first bytes: sequences with one tail merge
    their first bytes into one mask, and those with one first mask share a rule of their tails."""
    by_tail: dict[tuple[int, ...], int] = {}
    for seq in byte_sequences:
        masks = [(1 << (hi + 1)) - (1 << lo) for lo, hi in seq]
        if masks:
            by_tail[tuple(masks[1:])] = by_tail.get(tuple(masks[1:]), 0) | masks[0]
    by_head: dict[int, list[tuple[int, ...]]] = {}
    for tail, head in by_tail.items():
        by_head.setdefault(head, []).append(tail)
    alts: list[Alternative] = []
    for head, tails in by_head.items():
        if len(tails) == 1:
            alts.append([(TERMINAL, head)] + [(TERMINAL, mask) for mask in tails[0]])
        else:
            body = [[(TERMINAL, mask) for mask in tail] for tail in tails]
            alts.append([(TERMINAL, head), (REF, new_rule(body))])
    return alts or [[(TERMINAL, 0)]]


@dataclass(frozen=True)
class Program:
    """The rules flattened: element p is (kinds[p], values[p]); each alternative ends in END."""

    kinds: tuple[int, ...]
    values: tuple[int, ...]
    starts: tuple[tuple[int, ...], ...]  # per rule, the first position of each alternative
    after: tuple[Stack, ...]  # what replaces position p once it is matched: (p + 1,) or ()
    root: int
    members: tuple[FreeMembers, ...] = ()  # what MEMBERS elements write (JSON schemas only)

    @property
    def nbytes(self) -> int:
        return 72 * len(self.kinds) + 64 * len(self.starts)  # boxed ints and tuple slots, roughly


@dataclass(frozen=True)
class FreeMembers:
    """Members in any order, each at most once (pattern.Members' free ones), then the rest in order.
    A MEMBERS element's stack frame is its position with the set of members written above
    FRAME_SHIFT bits; it stands for, while the required ones are missing or as it chooses, member
    i (rule `firsts[i]` where none is written yet, else `others[i]`: the separator, then it) and the
    frame with i added; once they are all written, the rest (rule `rest_first` where none is
    written yet, else `rest`); `least`: not before one is written. Members in `again` may be
    written again."""

    firsts: tuple[int, ...]
    others: tuple[int, ...]
    needed: int  # the set of required members, a bit each
    rest_first: int
    rest: int
    least: bool = False
    again: int = 0  # the set of members written any number of times, a bit each
    rules: Rules = ()  # pattern.Members' rules: read with pattern.complete


FRAME_SHIFT = 32  # a frame's bits above this: a MEMBERS element's set of members written
POSITION = (1 << FRAME_SHIFT) - 1


def flatten(bodies: list[list[Alternative]], root: int, members: tuple[FreeMembers, ...] = ()) -> Program:
    kinds: list[int] = []
    values: list[int] = []
    starts: list[tuple[int, ...]] = []
    for body in bodies:
        firsts = []
        for alt in body:
            firsts.append(len(kinds))
            kinds.extend(kind for kind, _ in alt)
            values.extend(value for _, value in alt)
            kinds.append(END)
            values.append(0)
        starts.append(tuple(firsts))
    after = tuple((p + 1,) if kinds[p + 1] != END else () for p in range(len(kinds) - 1)) + ((),)
    return Program(tuple(kinds), tuple(values), tuple(starts), after, root, members)
