"""Grammar constraints: GBNF (parsed and checked by gbnf.py) run as a pushdown automaton over
bytes, and the per-row state that says which vocabulary tokens may come next.

Characters are bytes here, so a token may end inside a character and only valid UTF-8 is ever
produced. A parse past the stack bound is CONSTRAINT_TOO_LARGE, also mid-generation.

Parser state is llama.cpp's: a set of stacks of positions in the rules' flattened elements, each
with a byte class on top (or empty: the root is complete). States are interned and their byte
transitions filled in lazily in one table, so a mask is the vocabulary walked through that table
a byte column at a time (numpy gathers, longest tokens first): a transition is computed once per
grammar, however many tokens share it.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable

import numpy as np
import numpy.typing as npt

from engine.constrain.gbnf import END, FIELD, FRAME_SHIFT, POSITION, TERMINAL, Program, Stack, parse
from engine.constrain.gbnf_rules import MEMBERS
from engine.constrain.limits import DEFAULT_LIMITS, Limits
from engine.constrain.pattern import complete
from engine.constrain.vocabulary import DEAD, Layout, Vocabulary, walk
from engine.errors import InvalidInput

__all__ = ["CompiledGrammar", "GrammarRow", "compile_grammar"]

MAX_STATE_BYTES = 32 << 20  # or before the stacks of those states take this much
# A state's mask is first computed on its stacks' top MASK_DEPTH frames (a byte pops at most one
# frame, so most tokens never look deeper): states that differ only below them, the same value
# nested at another depth, share that work; the few tokens that reach below are walked alone.
# 3, not 2, since objects' members sit above a MEMBERS frame: inside a length-bounded string
# value, 2 let ~36k of 49k tokens reach below and be walked one by one (a cold mask ~100 ms;
# a random walk through bench/structured.py's schema: p99 91 -> 12 ms a mask, mean 2.5 -> 0.7).
MASK_DEPTH = 3

UNKNOWN = -1  # a transition table entry not computed yet (DEAD: the state with no stacks)
SIGNED_STACKS = 62  # stacks whose byte sets one int64 per byte tells apart (more: grouped by np.unique)

State = frozenset[Stack]


def compile_grammar(text: str, vocabulary: Vocabulary, limits: Limits = DEFAULT_LIMITS) -> CompiledGrammar:
    """Compile GBNF `text` for `vocabulary`; InvalidInput (GRAMMAR_INVALID, CONSTRAINT_TOO_LARGE)
    says what is wrong and where. Bounded by limits.max_grammar_{elements,stacks,states,masks,warm}."""
    program = parse(text, limits.max_grammar_elements)
    return CompiledGrammar(program, vocabulary, limits)


_SERIALS = itertools.count()
FINISHED: State = frozenset({()})  # every stack empty: only EOS may follow


class CompiledGrammar:
    """One grammar for one vocabulary: the masks of the parser states reached so far, cached and
    bounded, and the transitions rows walk. Safe to share between threads (one lock)."""

    def __init__(
        self, program: Program, vocabulary: Vocabulary, limits: Limits = DEFAULT_LIMITS, field: str = FIELD
    ) -> None:
        self._program, self._vocabulary, self._layout = program, vocabulary, vocabulary.layout
        self._field = field
        self._max_stacks, self._max_states = limits.max_grammar_stacks, limits.max_grammar_states
        self._max_masks, self._max_warm = limits.max_grammar_masks, limits.max_grammar_warm
        self._serial = next(_SERIALS)
        self._lock = threading.Lock()
        self._masks: OrderedDict[State, npt.NDArray[np.uint8]] = OrderedDict()
        self._mask_bytes = 0  # kept as masks come and go: other threads read nbytes meanwhile
        self._mark = len(program.kinds)  # a frame standing for those below MASK_DEPTH: any byte
        self._marked = Program(
            program.kinds + (TERMINAL,),
            program.values + ((1 << 256) - 1,),
            program.starts,
            program.after + ((self._mark,),),
            program.root,
            program.members,
        )
        self._shallow: OrderedDict[State, tuple[npt.NDArray[np.bool_], list[int]]] = OrderedDict()
        self._transitions = self._new_transitions()
        self._start = self._transitions.start()

    def start(self) -> GrammarRow:
        return GrammarRow(self, self._start)

    @property
    def program(self) -> Program:
        return self._program

    @property
    def vocabulary(self) -> Vocabulary:
        return self._vocabulary

    @property
    def nbytes(self) -> int:
        """Memory now: rules, transition table, states and cached masks (it grows, to the bounds)."""
        return self._program.nbytes + self._transitions.nbytes + self._mask_bytes

    @property
    def masks_cached(self) -> int:
        return len(self._masks)

    def key(self, state: State) -> Hashable:
        return (self._serial, state)

    def allowed(self, state: State) -> npt.NDArray[np.bool_]:
        with self._lock:
            packed = self._masks.get(state)
            if packed is None:
                packed = self._remember(state, self._mask(state, self._transitions, held=True))
            else:
                self._masks.move_to_end(state)
        return np.unpackbits(packed, count=self._vocabulary.size).view(np.bool_)

    def warm(self, stop: threading.Event | None = None) -> int:
        """Compute ahead the masks of the states rows reach first (the server runs it on a thread
        of its own after compiling, as for automata): breadth first from the start state, one token
        at a time, the states most tokens lead to first, at most max_grammar_warm of them. It walks
        a transition table of its own, so rows never wait for it; `stop` ends it early. The number
        of masks computed."""
        transitions, computed = self._new_transitions(), 0
        frontier, seen = deque([self._start]), {self._start}
        for _ in range(self._max_warm):
            if not frontier or stop is not None and stop.is_set():
                break
            state = frontier.popleft()
            try:
                ends = transitions.ends(state)
            except InvalidInput:  # past the stack bound: a row that gets here fails on its own
                continue
            with self._lock:
                known = state in self._masks
            if not known:
                packed = self._mask(state, transitions, held=False)
                with self._lock:
                    self._remember(state, packed)
                computed += 1
            fresh = [s for s in transitions.successors(ends) if s not in seen]
            seen.update(fresh)
            frontier.extend(fresh)
        return computed

    def advance(self, state: State, token: int) -> State:
        """The state after `token`; InvalidInput when the grammar does not allow it here."""
        vocabulary = self._vocabulary
        if token in vocabulary.eos_ids and () in state:
            return FINISHED
        usable = 0 <= token < vocabulary.size and vocabulary.usable[token]
        piece = vocabulary.pieces[token] if usable else None
        if piece:
            with self._lock:
                after = self._transitions.after(state, piece)
            if after:
                return after
        raise InvalidInput(
            f"token {token} is not allowed by the constraint here",
            reason="TOKEN_NOT_ALLOWED",
            field=self._field,
        )

    @property
    def initial(self) -> State:
        """The start state, for `after_bytes` (a walk by bytes, whatever tokens would write them)."""
        return self._start

    def after_bytes(self, state: State, data: bytes) -> State | None:
        """The state after `data`'s bytes from `state`; None where they cannot follow."""
        with self._lock:
            return self._transitions.after(state, data) or None

    def final(self, state: State) -> bool:
        return () in state

    def matches(self, data: bytes) -> bool:
        """Whether `data` is a whole match (the bytes alone, whatever tokens would write them)."""
        state = self.after_bytes(self._start, data)
        return state is not None and self.final(state)

    def _mask(self, state: State, transitions: _Transitions, held: bool) -> npt.NDArray[np.uint8]:
        """The state's mask: its shallow form's (the tokens alive whatever lies below its top
        frames), then the tokens alive only through the frames below walked on the state itself.
        `held`: the caller holds the lock (rows, with the shared transitions); else (warm, with
        its own) the lock is taken for the shallow cache alone."""
        shallow = frozenset(s if len(s) <= MASK_DEPTH else (self._mark, *s[-MASK_DEPTH:]) for s in state)
        with contextlib.nullcontext() if held else self._lock:
            found = self._shallow.get(shallow)
            if found is not None:
                self._shallow.move_to_end(shallow)
        if found is None:
            ends = transitions.ends(shallow)
            alive = ends != DEAD
            deeper = np.flatnonzero(alive & transitions.through(ends, self._mark))
            alive[deeper] = False
            found = (alive, deeper.tolist())
            with contextlib.nullcontext() if held else self._lock:
                self._shallow[shallow] = found
                if len(self._shallow) > self._max_masks:
                    self._shallow.popitem(last=False)
        alive, below = found
        mask = np.zeros(self._vocabulary.size, np.bool_)
        mask[self._layout.order] = alive
        if below:  # walked on the whole state, in one vectorized walk
            tokens = self._layout.order[below]
            vocabulary = self._vocabulary
            ends = transitions.walk(state, vocabulary.matrix[tokens], vocabulary.lengths[tokens])
            mask[tokens] = ends != DEAD
        mask[list(self._vocabulary.eos_ids)] = () in state
        return np.packbits(mask)

    def _remember(self, state: State, packed: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
        self._masks[state] = packed
        self._mask_bytes += packed.nbytes
        if len(self._masks) > self._max_masks:
            self._mask_bytes -= self._masks.popitem(last=False)[1].nbytes
        return packed

    def _new_transitions(self) -> _Transitions:
        return _Transitions(self._marked, self._layout, self._max_stacks, self._max_states, self._field)


class _Transitions:
    """Parser states interned by id, and their byte transitions filled in lazily in one table.
    Ids live within one call, so the table can start again between calls when full. Not
    thread-safe: its owner holds a lock around each call."""

    def __init__(
        self, program: Program, layout: Layout, max_stacks: int, max_states: int, field: str
    ) -> None:
        self._program, self._layout, self._field = program, layout, field
        self._max_stacks, self._max_states = max_stacks, max_states
        self._classes: dict[int, npt.NDArray[np.bool_]] = {}
        self._reset_table()

    @property
    def nbytes(self) -> int:
        return int(self._table.nbytes) + self._state_bytes

    def start(self) -> State:
        program = self._program
        return self._expand([(s,) if program.kinds[s] != END else () for s in program.starts[program.root]])

    def after(self, state: State, piece: bytes) -> State:
        """The state after `piece`'s bytes (DEAD's, empty, when they cannot follow)."""
        self._reset_if_full()
        state_id = self._intern(state)
        for byte in piece:
            if self._table[state_id, byte] == UNKNOWN:
                self._fill(np.array([state_id]), np.array([byte]))
            state_id = int(self._table[state_id, byte])
        return self._states[state_id]

    def walk(
        self, state: State, matrix: npt.NDArray[np.uint8], lengths: npt.NDArray[np.int32]
    ) -> npt.NDArray[np.int32]:
        """Where each of some tokens (`matrix[i]` its bytes, `lengths[i]` how many) leads from
        `state`: a state id valid until the next call, or DEAD."""
        self._reset_if_full()
        return walk(self._intern(state), matrix, lengths, self._next)

    def ends(self, state: State) -> npt.NDArray[np.int32]:
        """Where each usable token (in layout order) leads from `state`: a state id, valid until
        the next call, or DEAD (the table filled as the walk needs it)."""
        self._reset_if_full()
        return self._layout.ends(self._intern(state), self._next)

    def through(self, ends: npt.NDArray[np.int32], mark: int) -> npt.NDArray[np.bool_]:
        """Per token (from `ends` of this call): whether it is alive only through `mark` (every
        stack it leaves has the mark on top: the frames below decide)."""
        marked = np.zeros(len(self._states), np.bool_)
        for i in np.unique(ends[ends != DEAD]).tolist():
            marked[i] = all(stack and stack[-1] == mark for stack in self._states[i])
        return marked[ends]

    def successors(self, ends: npt.NDArray[np.int32]) -> list[State]:
        """The states tokens lead to (from `ends` of this call), those most tokens reach first."""
        ids, counts = np.unique(ends[ends != DEAD], return_counts=True)
        return [self._states[i] for i in ids[np.argsort(-counts, kind="stable")].tolist()]

    def _next(self, state_ids: npt.NDArray[np.int32], column: npt.NDArray[np.uint8]) -> npt.NDArray[np.int32]:
        targets = self._table[state_ids, column]
        unknown = targets == UNKNOWN
        if unknown.any():
            self._fill(state_ids[unknown], column[unknown])
            targets = self._table[state_ids, column]
        return targets

    def _fill(self, state_ids: npt.NDArray[np.int32], column: npt.NDArray[np.uint8]) -> None:
        """The transitions asked for, and every other byte's that needs no more work: a byte's
        successor depends only on which of the state's stacks its top byte class holds, so the
        bytes of one such set share one step (a string's position: every character one step)."""
        if len(state_ids) == 1:
            self._fill_row(int(state_ids[0]), column)
            return
        for state_id in np.unique(state_ids).tolist():
            self._fill_row(state_id, column[state_ids == state_id])

    def _fill_row(self, state_id: int, asked: npt.NDArray[np.uint8]) -> None:
        stacks = [stack for stack in self._states[state_id] if stack]  # (): complete, no byte follows
        if len(stacks) <= SIGNED_STACKS:  # which stacks a byte advances, as the bits of one int
            signature = np.zeros(256, np.int64)
            for j, stack in enumerate(stacks):
                signature[self._class(stack[-1])] |= 1 << j
        else:
            classes = np.stack([self._class(stack[-1]) for stack in stacks])  # [stacks, 256]
            _, inverse = np.unique(np.packbits(classes, axis=0).T, axis=0, return_inverse=True)
            signature = inverse.reshape(-1).astype(np.int64)
        after = self._program.after
        requested = np.zeros(256, np.bool_)
        requested[asked] = True  # `asked` holds a byte per token still alive: up to the vocabulary
        for group in set(signature[requested].tolist()):
            byte = int(np.argmax(signature == group))
            chosen = [stack[:-1] + after[stack[-1]] for stack in stacks if self._class(stack[-1])[byte]]
            target = self._intern(self._expand(chosen)) if chosen else DEAD
            self._table[state_id, signature == group] = target

    def _class(self, position: int) -> npt.NDArray[np.bool_]:
        """A terminal's byte class as 256 bools (cached per element)."""
        found = self._classes.get(position)
        if found is None:
            value = self._program.values[position]
            bits = np.frombuffer(value.to_bytes(32, "little"), np.uint8)
            found = self._classes[position] = np.unpackbits(bits, bitorder="little").astype(bool)
        return found

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
            kind = kinds[stack[-1] & POSITION] if stack else TERMINAL
            if kind == TERMINAL:
                out.add(stack)
                if len(out) > self._max_stacks:
                    raise InvalidInput(
                        f"more than {self._max_stacks} parses at once (an ambiguous grammar or schema)",
                        reason="CONSTRAINT_TOO_LARGE",
                        field=self._field,
                    )
                continue
            if kind == MEMBERS:
                work.extend(self._members(stack))
                continue
            rest = stack[:-1] + after[stack[-1]]
            work.extend(rest + (s,) if kinds[s] != END else rest for s in starts[values[stack[-1]]])
        return frozenset(out)

    def _members(self, stack: Stack) -> Iterable[Stack]:
        """What a MEMBERS frame on top stands for (gbnf.FreeMembers): each member not yet written,
        above the frame with it added (the repeatable ones, `again`, any number of times); the
        rest, once the required ones are written."""
        program = self._program
        kinds, starts = program.kinds, program.starts
        top = stack[-1]
        position, written, below = top & POSITION, top >> FRAME_SHIFT, stack[:-1]
        free = program.members[program.values[position]]
        if complete(written, free.needed, free.rules) and (written or not free.least):
            rest, then = below + program.after[position], free.rest if written else free.rest_first
            yield from (rest + (s,) if kinds[s] != END else rest for s in starts[then])
        for i, rule in enumerate(free.others if written else free.firsts):
            if not (written & ~free.again) >> i & 1:
                frame = below + (position | (written | 1 << i) << FRAME_SHIFT,)
                yield from (frame + (s,) if kinds[s] != END else frame for s in starts[rule])


class GrammarRow:
    """One generated sequence's place in a grammar (the row-state protocol of engine/constrain)."""

    __slots__ = ("_grammar", "_state")

    def __init__(self, grammar: CompiledGrammar, state: State) -> None:
        self._grammar, self._state = grammar, state

    def allowed(self) -> npt.NDArray[np.bool_]:
        """Token i is allowed iff all its bytes can follow; EOS ids iff the text may end here."""
        return self._grammar.allowed(self._state)

    @property
    def state(self) -> State:
        """The parser state: its stacks of rule positions."""
        return self._state

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
