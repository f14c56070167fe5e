"""Grammar constraints: llama.cpp's GBNF compiled into a pushdown automaton over bytes, and the
per-row state that says which vocabulary tokens may come next.

Notation (GBNF). A grammar is rules `name ::= alternatives`; the start rule is `root`. Names are
`[A-Za-z0-9_-]+`. Alternatives are separated by `|`; a sequence is items one after another:
  "text"      a literal; escapes \\n \\t \\r \\\\ \\" \\[ \\] \\- \\xNN \\uNNNN \\UNNNNNNNN (code points)
  [a-z_]      a character class, `[^...]` its complement; the same escapes; `-` first or last is itself
  .           any character
  name        a rule;  ( ... ) a group
  X* X+ X?    repetition, and X{m} X{m,} X{m,n} (bounds on the item just before)
`#` starts a comment to the end of the line. Newlines are whitespace: a rule runs on until the next
`name ::=`. Not supported: llama.cpp's token references `<[id]>` and `{,n}`.

Semantics over bytes: characters are their UTF-8 bytes and classes are byte sequences, so a
token may end inside a character and only valid UTF-8 is ever produced. Rejected, with line and
column (InvalidInput, reason GRAMMAR_INVALID): syntax errors, an undefined rule, a missing root,
a rule defined twice, left recursion (direct, indirect or through rules that can be empty, as
llama.cpp rejects it), a rule that matches no finite text. A grammar past the element bound, or a
parse past the stack bound, is CONSTRAINT_TOO_LARGE.

Parser state is llama.cpp's: a set of stacks of positions in the rules' flattened elements, each
with a byte class on top (or empty: the root is complete). Repetitions become rules when compiled.
States are interned and their byte transitions filled in lazily in one table, so a mask is the
vocabulary walked through that table a byte column at a time (numpy gathers, longest tokens
first): a transition is computed once per grammar, however many tokens share it.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt

from engine.constrain.pattern import MAX_CODE_POINT, SURROGATES, complement, normalize, subtract
from engine.constrain.utf8 import ByteRanges, sequences
from engine.constrain.vocabulary import Vocabulary
from engine.errors import InvalidInput

__all__ = ["CompiledGrammar", "GrammarRow", "compile_grammar"]

FIELD = "constraint.grammar"
MAX_ELEMENTS = 1 << 16  # elements of the compiled rules, repetitions expanded
MAX_STACKS = 4096  # stacks in one parser state: the grammar's ambiguity at one byte
MAX_STATES = 4096  # interned states before the transition table starts again (1 KiB each)
MAX_STATE_BYTES = 32 << 20  # or before the stacks of those states take this much
MAX_NESTING = 64  # parenthesized groups within one another (the parser recurses)
MAX_MASKS = 256  # cached masks per grammar, packed (vocabulary / 8 bytes each)

TERMINAL, REF, END = 0, 1, 2  # element kinds; a terminal's value is a 256-bit byte mask
UNKNOWN, DEAD = -1, 0  # transition table entries: not computed yet; the state with no stacks

Element = tuple[int, int]
Alternative = list[Element]
Stack = tuple[int, ...]
State = frozenset[Stack]
Ranges = list[tuple[int, int]]

SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-"}
HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}


def compile_grammar(text: str, vocabulary: Vocabulary, limits: Any = None) -> CompiledGrammar:
    """Compile GBNF `text` for `vocabulary`; InvalidInput (GRAMMAR_INVALID, CONSTRAINT_TOO_LARGE)
    says what is wrong and where. `limits` may set max_grammar_{elements,stacks,states,masks}."""
    rules = _Parser(text, getattr(limits, "max_grammar_elements", MAX_ELEMENTS)).parse()
    return CompiledGrammar(_finish(rules), vocabulary, limits)


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
            raise _invalid(self.text, offset, f"more than {self.max_elements} elements once repetitions "
                           "are expanded", reason="CONSTRAINT_TOO_LARGE")

    def repetition(self, parent: str, item: Alternative, low: int, high: int | None,
                   offset: int) -> Alternative:
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
            alts = _byte_alternatives(sequences(key), lambda body: self.synthetic(parent, body, offset))
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


def _byte_alternatives(byte_sequences: Iterable[ByteRanges],
                       new_rule: Callable[[list[Alternative]], int]) -> list[Alternative]:
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
class _Program:
    """The rules flattened: element p is (kinds[p], values[p]); each alternative ends in END."""

    kinds: tuple[int, ...]
    values: tuple[int, ...]
    starts: tuple[tuple[int, ...], ...]  # per rule, the first position of each alternative
    after: tuple[Stack, ...]  # what replaces position p once it is matched: (p + 1,) or ()
    root: int

    @property
    def nbytes(self) -> int:
        return 72 * len(self.kinds) + 64 * len(self.starts)  # boxed ints and tuple slots, roughly


def _finish(rules: _Rules) -> _Program:
    """Check the parsed rules (defined, root, productive, no left recursion) and flatten them."""
    for rule, body in enumerate(rules.bodies):
        if body is None:
            raise _invalid(rules.text, rules.offsets[rule], f"rule '{rules.names[rule]}' is not defined")
    if "root" not in rules.ids:
        raise _invalid(rules.text, 0, "no rule named 'root' (the start rule)")
    bodies = _productive_bodies(rules, [body or [] for body in rules.bodies])
    cycle = _left_cycle(bodies, _nullable(bodies))
    if cycle:
        _left_recursion(rules, cycle)
    return _flatten(bodies, rules.ids["root"])


def _productive_bodies(rules: _Rules, bodies: list[list[Alternative]]) -> list[list[Alternative]]:
    """Bodies without the alternatives that can never finish; a named rule left with none is an error."""
    productive = [False] * len(bodies)

    def finishes(alt: Alternative) -> bool:
        return all(value != 0 if kind == TERMINAL else productive[value] for kind, value in alt)

    changed = True
    while changed:
        changed = False
        for rule, body in enumerate(bodies):
            if not productive[rule] and any(finishes(alt) for alt in body):
                productive[rule] = changed = True
    for name, rule in rules.ids.items():
        if not productive[rule]:
            raise _invalid(rules.text, rules.offsets[rule], f"rule '{name}' matches no finite text")
    return [[alt for alt in body if finishes(alt)] for body in bodies]


def _nullable(bodies: list[list[Alternative]]) -> list[bool]:
    nullable = [False] * len(bodies)
    changed = True
    while changed:
        changed = False
        for rule, body in enumerate(bodies):
            if not nullable[rule] and any(all(k == REF and nullable[v] for k, v in alt) for alt in body):
                nullable[rule] = changed = True
    return nullable


def _left_cycle(bodies: list[list[Alternative]], nullable: list[bool]) -> list[int]:
    """A cycle of rules each of which can start with the next, or [] when there is none."""
    edges: list[list[int]] = []
    for body in bodies:
        firsts = []
        for alt in body:
            for kind, value in alt:
                if kind != REF:
                    break
                firsts.append(value)
                if not nullable[value]:
                    break
        edges.append(firsts)
    color = [0] * len(bodies)  # 0 unseen, 1 on the path, 2 done
    for top in range(len(bodies)):
        if color[top]:
            continue
        path, pending = [top], [iter(edges[top])]
        color[top] = 1
        while path:
            nxt = next(pending[-1], None)
            if nxt is None:
                color[path.pop()] = 2
                pending.pop()
            elif color[nxt] == 1:
                return path[path.index(nxt) :]
            elif color[nxt] == 0:
                color[nxt] = 1
                path.append(nxt)
                pending.append(iter(edges[nxt]))
    return []


def _left_recursion(rules: _Rules, cycle: list[int]) -> NoReturn:
    if all(rule in rules.repeats for rule in cycle):
        raise _invalid(rules.text, rules.offsets[cycle[0]], "a repetition of something that can match "
                       "nothing (left recursion)")
    named = [rule for rule in cycle if rules.ids.get(rules.names[rule]) == rule] or cycle
    names = " -> ".join(rules.names[rule] for rule in [*cycle, cycle[0]])
    raise _invalid(rules.text, rules.offsets[named[0]], f"rule '{rules.names[named[0]]}' is left-recursive "
                   f"({names}); rewrite it with repetition, as in a ::= b (\"+\" b)*")


def _flatten(bodies: list[list[Alternative]], root: int) -> _Program:
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
    return _Program(tuple(kinds), tuple(values), tuple(starts), after, root)


@dataclass(frozen=True)
class _Layout:
    """A vocabulary's usable tokens, longest first, by byte column: `columns[d]` holds byte d of
    every token longer than d, so those tokens are a prefix of `order`."""

    order: npt.NDArray[np.intp]
    columns: tuple[npt.NDArray[np.uint8], ...]

    @classmethod
    def of(cls, vocabulary: Vocabulary) -> _Layout:
        layout = _LAYOUTS.get(vocabulary)
        if layout is None:
            ids = np.flatnonzero(vocabulary.usable)
            order = ids[np.argsort(-vocabulary.lengths[ids], kind="stable")]
            lengths = vocabulary.lengths[order]
            width = int(lengths.max(initial=0))
            columns = tuple(np.ascontiguousarray(vocabulary.matrix[order[lengths > d], d])
                            for d in range(width))
            layout = _LAYOUTS[vocabulary] = cls(order, columns)
        return layout


_LAYOUTS: weakref.WeakKeyDictionary[Vocabulary, _Layout] = weakref.WeakKeyDictionary()
_SERIALS = itertools.count()
FINISHED: State = frozenset({()})  # every stack empty: only EOS may follow


class CompiledGrammar:
    """One grammar for one vocabulary: parser states, their byte transitions and token masks,
    cached and bounded. Safe to share between threads (one lock)."""

    def __init__(self, program: _Program, vocabulary: Vocabulary, limits: Any = None) -> None:
        self._program, self._vocabulary, self._layout = program, vocabulary, _Layout.of(vocabulary)
        self._max_stacks = getattr(limits, "max_grammar_stacks", MAX_STACKS)
        self._max_states = getattr(limits, "max_grammar_states", MAX_STATES)
        self._max_masks = getattr(limits, "max_grammar_masks", MAX_MASKS)
        self._serial = next(_SERIALS)
        self._lock = threading.Lock()
        self._masks: OrderedDict[State, npt.NDArray[np.uint8]] = OrderedDict()
        self._reset_table()
        firsts = program.starts[program.root]
        self._start = self._expand([(s,) if program.kinds[s] != END else () for s in firsts])

    def start(self) -> GrammarRow:
        return GrammarRow(self, self._start)

    @property
    def nbytes(self) -> int:
        """Memory now: rules, transition table, states and cached masks (it grows, to the bounds)."""
        masks = sum(mask.nbytes for mask in self._masks.values())
        return self._program.nbytes + int(self._table.nbytes) + self._state_bytes + masks

    def key(self, state: State) -> Hashable:
        return (self._serial, state)

    def allowed(self, state: State) -> npt.NDArray[np.bool_]:
        with self._lock:
            packed = self._masks.get(state)
            if packed is None:
                packed = self._masks[state] = np.packbits(self._walk_vocabulary(state))
                if len(self._masks) > self._max_masks:
                    self._masks.popitem(last=False)
            else:
                self._masks.move_to_end(state)
        return np.unpackbits(packed, count=self._vocabulary.size).view(np.bool_)

    def advance(self, state: State, token: int) -> State:
        """The state after `token`; InvalidInput when the grammar does not allow it here."""
        vocabulary = self._vocabulary
        if token in vocabulary.eos_ids and () in state:
            return FINISHED
        usable = 0 <= token < vocabulary.size and vocabulary.usable[token]
        piece = vocabulary.pieces[token] if usable else None
        with self._lock:
            self._reset_if_full()
            state_id = self._intern(state)
            for byte in piece or b"":
                if self._table[state_id, byte] == UNKNOWN:
                    self._fill(np.array([state_id]), np.array([byte]))
                state_id = int(self._table[state_id, byte])
            if piece and state_id != DEAD:
                return self._states[state_id]
        raise InvalidInput(f"token {token} is not allowed by the grammar here", reason="TOKEN_NOT_ALLOWED",
                           field=FIELD)

    def _walk_vocabulary(self, state: State) -> npt.NDArray[np.bool_]:
        """Every usable token through the transition table, one byte column at a time."""
        self._reset_if_full()
        layout = self._layout
        states = np.full(len(layout.columns[0]) if layout.columns else 0, self._intern(state), np.int32)
        for column in layout.columns:
            live = states[: len(column)]
            nxt = self._table[live, column]
            unknown = nxt == UNKNOWN
            if unknown.any():
                self._fill(live[unknown], column[unknown])
                nxt = self._table[live, column]
            states[: len(column)] = nxt
            if not nxt.any():
                break
        mask = np.zeros(self._vocabulary.size, np.bool_)
        mask[layout.order] = states != DEAD
        mask[list(self._vocabulary.eos_ids)] = () in state
        return mask

    def _fill(self, state_ids: npt.NDArray[np.int32], column: npt.NDArray[np.uint8]) -> None:
        for pair in np.unique(state_ids.astype(np.int64) * 256 + column).tolist():
            state_id, byte = divmod(pair, 256)
            target = self._intern(self._step(self._states[state_id], byte))
            self._table[state_id, byte] = target

    def _reset_table(self) -> None:
        self._states: list[State] = [frozenset()]
        self._ids: dict[State, int] = {frozenset(): DEAD}
        self._table = np.full((64, 256), UNKNOWN, np.int32)
        self._table[DEAD] = DEAD
        self._state_bytes = 0

    def _reset_if_full(self) -> None:
        # Ids live only within one call, so the table can start again between calls.
        if len(self._states) > self._max_states or self._state_bytes > MAX_STATE_BYTES:
            self._reset_table()

    def _intern(self, state: State) -> int:
        state_id = self._ids.get(state)
        if state_id is None:
            state_id = self._ids[state] = len(self._states)
            self._states.append(state)
            self._state_bytes += sum(64 + 8 * len(stack) for stack in state)
            if state_id == len(self._table):
                self._table = np.concatenate([self._table, np.full_like(self._table, UNKNOWN)])
        return state_id

    def _step(self, state: State, byte: int) -> State:
        bit, values, after = 1 << byte, self._program.values, self._program.after
        return self._expand([stack[:-1] + after[stack[-1]]
                             for stack in state if stack and values[stack[-1]] & bit])

    def _expand(self, stacks: Iterable[Stack]) -> State:
        """Replace rule references on top of stacks by their alternatives until a byte class (or
        nothing: the root is complete) is on top of each."""
        program = self._program
        kinds, values, after, starts = program.kinds, program.values, program.after, program.starts
        out: set[Stack] = set()
        seen: set[Stack] = set()
        work = list(stacks)
        while work:
            stack = work.pop()
            if stack in seen:
                continue
            seen.add(stack)
            if not stack or kinds[stack[-1]] == TERMINAL:
                out.add(stack)
                if len(out) > self._max_stacks:
                    raise InvalidInput(f"grammar: more than {self._max_stacks} parses at once (an ambiguous "
                                       "grammar)", reason="CONSTRAINT_TOO_LARGE", field=FIELD)
                continue
            rest = stack[:-1] + after[stack[-1]]
            work.extend(rest + (s,) if kinds[s] != END else rest for s in starts[values[stack[-1]]])
        return frozenset(out)


class GrammarRow:
    """One generated sequence's place in a grammar (the row-state protocol of engine/constrain)."""

    __slots__ = ("_grammar", "_state")

    def __init__(self, grammar: CompiledGrammar, state: State) -> None:
        self._grammar, self._state = grammar, state

    def allowed(self) -> npt.NDArray[np.bool_]:
        """Token i is allowed iff all its bytes can follow; EOS ids iff the text may end here."""
        return self._grammar.allowed(self._state)

    @property
    def state_key(self) -> Hashable:
        """Equal keys, equal masks (the grammar's serial and the parser state)."""
        return self._grammar.key(self._state)

    def advance(self, token: int) -> None:
        self._state = self._grammar.advance(self._state, token)

    @property
    def done(self) -> bool:
        """Nothing but EOS may follow."""
        return self._state == FINISHED

    @property
    def accepts(self) -> bool:
        """EOS is allowed now."""
        return () in self._state

    def copy(self) -> GrammarRow:
        return GrammarRow(self._grammar, self._state)
