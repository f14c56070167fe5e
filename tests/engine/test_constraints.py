"""engine/constrain: regex and choice constraints, token masks, rows, the cache (JSON Schema: in
test_constraints_schema.py). Most tests use a small synthetic vocabulary: every single byte, some
multi-byte pieces (a few split mid-character), an EOS id, a special id and padding ids."""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from engine.constrain import ConstraintCache, Limits, Vocabulary, compile_constraint
from engine.constrain.automaton import MOVE_BYTES, Automaton, AutomatonRow
from engine.constrain.gbnf import END, FRAME_SHIFT, POSITION, TERMINAL, Program
from engine.constrain.gbnf_rules import MEMBERS
from engine.constrain.grammar import CompiledGrammar
from engine.constrain.pattern import complete
from engine.errors import InvalidInput
from tests.support.vocabularies import EOS, PIECES, SIZE, SPECIAL, VOCAB, synthetic

REGEXES = [
    r"abc",
    r"(ab|c)+[0-9]{2,3}é?",
    r"[a-c]*d",
    r"\d{3}-\d{4}",
    r"(?:yes|no|maybe)",
    r"x{2,}y?",
    r"[^a-z\n]{1,4}",
    r".{3}",
    r"\w+@\w+\.(com|org)",
    r"\s?-?(0|[1-9]\d*)(\.\d+)?",
    r"(a|b)*?c",
    r"^start (end)?$",
    r"\Acafé|日本\Z",
    r"[\u00e0-\u00ff]{2}",
    r"(\(\d\))+",
    r"[^\"]{0,3}",
]


def dfa_of(compiled: object) -> Automaton:
    assert isinstance(compiled, Automaton)
    return compiled


def distances(automaton: Automaton) -> np.ndarray:
    """Bytes from each DFA state to the nearest accepting one (the dead state: huge)."""
    table = automaton.dfa.table
    far = np.full(table.shape[0], 1 << 30, dtype=np.int64)
    far[automaton.dfa.accepting] = 0
    while True:
        nearer = np.minimum(far, far[table].min(axis=1) + 1)
        nearer[0] = 1 << 30
        if np.array_equal(nearer, far):
            return far
        far = nearer


def end_states(automaton: Automaton, state: int, ids: np.ndarray) -> np.ndarray:
    vocabulary = automaton.vocabulary
    current = np.full(len(ids), state, dtype=np.int64)
    for j in range(vocabulary.matrix.shape[1]):
        step = automaton.dfa.table[current, vocabulary.matrix[ids, j]]
        current = np.where(j < vocabulary.lengths[ids], step, current)
    return current


def random_walk(
    compiled: object, seed: int, greed: float = 0.5, max_steps: int = 5000
) -> tuple[bytes, list[int]]:
    """Allowed tokens to EOS: half the time one that gets nearest to a match, else any; past a
    fifth of `max_steps`, always the nearest (any token may start another member of an object,
    which random steps would do forever: the walk must end). Nearest on
    a DFA: fewest bytes to an accepting state; on the pushdown engine: the fewest bytes that finish
    some parse (its stacks' rests)."""
    if isinstance(compiled, CompiledGrammar):
        rest = completions(compiled.program)
        vocabulary = compiled.vocabulary

        def reach(state: object, tokens: np.ndarray) -> np.ndarray:
            return np.array(
                [
                    min(sum(rest(frame) for frame in stack) for stack in compiled.advance(state, int(t)))
                    for t in tokens
                ]
            )
    else:
        automaton = dfa_of(compiled)
        far, vocabulary = distances(automaton), automaton.vocabulary

        def reach(state: object, tokens: np.ndarray) -> np.ndarray:
            return far[end_states(automaton, state, tokens)]  # type: ignore[arg-type]

    rng, row, out, taken = np.random.default_rng(seed), compiled.start(), b"", []  # type: ignore[attr-defined]
    for step in range(max_steps):
        allowed = np.flatnonzero(row.allowed())
        eos = [t for t in allowed if t in vocabulary.eos_ids]
        if eos and (row.done or rng.random() < 0.25):
            row.advance(int(eos[0]))
            return out, taken
        tokens = np.array([t for t in allowed if t not in vocabulary.eos_ids])
        if rng.random() < greed or step > max_steps // 5:
            near = reach(row.state, tokens)
            tokens = tokens[near == near.min()]
        token = int(rng.choice(tokens))
        row.advance(token)
        out += vocabulary.pieces[token] or b""
        taken.append(token)
    raise AssertionError(f"no EOS after {max_steps} tokens: {out[:200]!r}")


def completions(program: Program) -> Callable[[int], int]:
    """Per stack frame, about the fewest bytes that finish its alternative (a fixed point; a
    MEMBERS frame: its required members not yet written, each alone, then the rest)."""
    far = 1 << 30
    rest, rule = [far] * len(program.kinds), [far] * len(program.starts)

    def members(value: int, written: int) -> int:
        free = program.members[value]
        rules = free.others if written else free.firsts
        wanted = written | free.needed  # and, rule by rule, each written member's cheapest list
        while not complete(wanted, free.needed, free.rules):
            for member, lists in free.rules:
                if wanted >> member & 1 and not any(wanted & names == names for names in lists):
                    wanted |= min(
                        lists, key=lambda names: sum(rule[r] for i, r in enumerate(rules) if names >> i & 1)
                    )
        missing = [rule[r] for i, r in enumerate(rules) if wanted >> i & 1 and not written >> i & 1]
        return min(far, sum(missing) + rule[free.rest if written or missing else free.rest_first])

    changed = True
    while changed:
        changed = False
        for p in reversed(range(len(program.kinds))):
            kind, value = program.kinds[p], program.values[p]
            after = rest[p + 1] if p + 1 < len(rest) else 0
            own = 1 if kind == TERMINAL else members(value, 0) if kind == MEMBERS else rule[value]
            found = 0 if kind == END else min(far, own + after)
            if found < rest[p]:
                rest[p], changed = found, True
        for r, starts in enumerate(program.starts):
            best = min((rest[s] for s in starts), default=far)
            if best < rule[r]:
                rule[r], changed = best, True

    def finish(frame: int) -> int:
        position, written = frame & POSITION, frame >> FRAME_SHIFT
        if not written:
            return rest[position]
        after = rest[position + 1] if position + 1 < len(rest) else 0
        return min(far, members(program.values[position], written) + after)

    return finish


def accepts(compiled: object, data: bytes) -> bool:
    """Whether `data` is a whole match, on either engine (a DFA or the pushdown one)."""
    assert isinstance(compiled, Automaton | CompiledGrammar), type(compiled)
    return compiled.matches(data)


def raises(kind: str, spec: str | list[str], reason: str, limits: Limits | None = None) -> InvalidInput:
    with pytest.raises(InvalidInput) as caught:
        compile_constraint(kind, spec, VOCAB, limits or Limits())
    assert caught.value.reason == reason, str(caught.value)
    return caught.value


# Regex


@pytest.mark.parametrize("pattern", REGEXES)
def test_random_walks_through_a_regex_end_in_a_full_match(pattern: str) -> None:
    compiled = compile_constraint("regex", pattern, VOCAB)
    for seed in range(12):
        out, _ = random_walk(compiled, seed)
        assert re.fullmatch(pattern, out.decode("utf-8"), re.ASCII), out


@pytest.mark.parametrize("pattern", REGEXES)
def test_a_regex_accepts_exactly_the_strings_python_re_fully_matches(pattern: str) -> None:
    compiled = compile_constraint("regex", pattern, VOCAB)
    alphabet = ["a", "b", "c", "d", "0", "1", "-", " ", "é", "日", "\n", "("]
    for length in range(5):
        for letters in itertools.product(alphabet, repeat=length):
            word = "".join(letters)
            assert accepts(compiled, word.encode()) == bool(re.fullmatch(pattern, word, re.ASCII)), word


@pytest.mark.parametrize("pattern", REGEXES[:8])
def test_every_token_a_regex_row_allows_keeps_the_match_alive(pattern: str) -> None:
    compiled = dfa_of(compile_constraint("regex", pattern, VOCAB))
    for seed in range(4):
        _, taken = random_walk(compiled, seed)
        row = compiled.start()
        for token in [None, *taken]:
            if token is not None:
                row.advance(token)
            allowed = row.allowed()
            one_by_one = [compiled.walk(row.state, t) != 0 if VOCAB.usable[t] else False for t in range(SIZE)]
            one_by_one[EOS] = row.accepts or not any(one_by_one)
            assert allowed.tolist() == one_by_one


def test_anchors_at_the_edges_match_what_the_bare_regex_matches() -> None:
    anchored, bare = (compile_constraint("regex", p, VOCAB) for p in (r"^a(b|c)\Z", r"a(b|c)"))
    for word in [b"ab", b"ac", b"a", b"abc", b"", b"b"]:
        assert accepts(anchored, word) == accepts(bare, word)


@pytest.mark.parametrize(
    ("pattern", "named"),
    [
        (r"(a)\1", "backreference"),
        (r"a(?=b)", "lookahead"),
        (r"(?<!a)b", "lookahead or lookbehind"),
        (r"\bword", "word boundaries"),
        (r"(?i)abc", "flags"),
        (r"(?i:a)b", "scoped flags"),
        (r"a++", "possessive"),
        (r"(?>ab)", "atomic group"),
        (r"(a)?(?(1)b|c)", "conditional"),
        (r"a^b", "anchor"),
        (r"a$b", "anchor"),
        (r"(^a)*", "anchor"),
    ],
)
def test_an_unsupported_regex_construct_is_named_in_the_error(pattern: str, named: str) -> None:
    error = raises("regex", pattern, "REGEX_UNSUPPORTED")
    assert named in str(error) and error.field == "regex"


def test_a_regex_that_does_not_parse_is_regex_invalid() -> None:
    assert raises("regex", "(ab", "REGEX_INVALID").field == "regex"
    raises("regex", "(?:" * 3000 + "a" + ")" * 3000, "REGEX_INVALID")


def test_a_regex_that_matches_nothing_is_unsatisfiable() -> None:
    raises("regex", "[^\\x00-\\U0010ffff]", "CONSTRAINT_UNSATISFIABLE")


def test_a_regex_past_the_state_limit_is_constraint_too_large() -> None:
    # A DFA must remember the last 17 letters: 2**17 states.
    raises("regex", "(a|b)*a(a|b){16}", "CONSTRAINT_TOO_LARGE")
    raises("regex", "a{100000}", "CONSTRAINT_TOO_LARGE")
    raises("regex", "[a-z]{50}", "CONSTRAINT_TOO_LARGE", Limits(max_states=20))
    raises("regex", "a" * 70_000, "CONSTRAINT_TOO_LARGE")


# UTF-8


def test_a_choice_of_multibyte_strings_completes_across_tokens_split_mid_character() -> None:
    compiled = dfa_of(compile_constraint("choice", ["café", "日本"], VOCAB))
    outputs = {random_walk(compiled, seed, greed=0.0)[0].decode("utf-8") for seed in range(60)}
    assert outputs == {"café", "日本"}
    row = compiled.start()
    for piece in (b"caf", b"\xc3"):
        row.advance(PIECES.index(piece))
    assert {VOCAB.pieces[t] for t in np.flatnonzero(row.allowed())} == {b"\xa9"}


def test_no_row_allows_a_byte_that_breaks_utf8() -> None:
    compiled = compile_constraint("regex", ".{2}", VOCAB)
    for seed in range(40):
        out, _ = random_walk(compiled, seed, greed=0.0)
        assert len(out.decode("utf-8")) == 2
    row = compiled.start()
    row.advance(0xED)  # U+D000-U+D7FF only: a second byte of A0-BF would start a surrogate
    allowed = row.allowed()
    assert allowed[0x80:0xA0].all() and not allowed[0xA0:0xC0].any()


# Rows and masks


def test_eos_is_allowed_exactly_where_the_output_matches() -> None:
    row = compile_constraint("regex", "ab(cd)?", VOCAB).start()
    for piece, matched in [(b"a", False), (b"b", True), (b"c", False), (b"d", True)]:
        row.advance(PIECES.index(piece))
        assert row.allowed()[EOS] == matched == row.accepts


def test_a_done_row_allows_only_eos_and_a_finished_one_keeps_allowing_it() -> None:
    row = compile_constraint("choice", ["abc"], VOCAB).start()
    row.advance(PIECES.index(b"abc"))
    assert row.done and np.flatnonzero(row.allowed()).tolist() == [EOS]
    row.advance(EOS)
    assert row.done and row.accepts and np.flatnonzero(row.allowed()).tolist() == [EOS]


def test_advance_rejects_a_token_the_row_does_not_allow() -> None:
    row = compile_constraint("choice", ["abc"], VOCAB).start()
    for token in (PIECES.index(b"b"), EOS, SPECIAL, SIZE - 1, SIZE, -1):
        with pytest.raises(InvalidInput) as caught:
            row.advance(token)
        assert caught.value.reason == "TOKEN_NOT_ALLOWED"


def test_a_remembered_move_never_lets_a_token_through_where_its_state_refuses_it() -> None:
    compiled = compile_constraint("regex", "(ab|c)+", VOCAB)
    walked = compiled.start()
    for piece in (b"ab", b"c", b"ab"):  # every move from these states is remembered now
        walked.advance(PIECES.index(piece))
    for token in (PIECES.index(b"b"), -1, SIZE, SIZE + PIECES.index(b"c")):
        row = compiled.start()
        row.advance(PIECES.index(b"ab"))
        with pytest.raises(InvalidInput):  # "b" alone cannot follow, nor ids out of the vocabulary
            row.advance(token)
    again = compiled.start()
    for piece in (b"ab", b"c", b"ab"):
        again.advance(PIECES.index(piece))
    assert again.state == walked.state and again.accepts


def test_special_and_padding_ids_are_never_allowed() -> None:
    allowed = compile_constraint("regex", "[\\x00-\\U0010ffff]*", VOCAB).start().allowed()
    assert allowed[ord("a")] and allowed[EOS] and not allowed[SPECIAL:].any()


def test_copies_advance_independently() -> None:
    row = compile_constraint("regex", "[ab]{3}", VOCAB).start()
    row.advance(PIECES.index(b"a"))
    fork = row.copy()
    fork.advance(PIECES.index(b"ab"))
    assert fork.accepts and not row.accepts and row.allowed()[PIECES.index(b"ab")]


def test_rows_with_equal_state_keys_have_equal_masks_and_constraints_never_share_keys() -> None:
    compiled = compile_constraint("regex", "(ab|a b)c", VOCAB)
    one, two = compiled.start(), compiled.start()
    one.advance(PIECES.index(b"ab"))
    for piece in (b"a", b"b"):
        two.advance(PIECES.index(piece))
    assert one.state_key == two.state_key and (one.allowed() == two.allowed()).all()
    assert compile_constraint("regex", "(ab|a b)c", VOCAB).start().state_key != compiled.start().state_key


def test_a_state_no_token_can_leave_allows_eos_and_does_not_accept() -> None:
    # No token holds byte 0x01: after "a" the match cannot go on, so the row may only end.
    vocabulary = synthetic([p for p in PIECES if p != b"\x01"])
    row = compile_constraint("regex", "a\\x01b", vocabulary).start()
    row.advance(vocabulary.pieces.index(b"a"))
    assert row.done and not row.accepts
    assert np.flatnonzero(row.allowed()).tolist() == list(vocabulary.eos_ids)


def test_masks_are_cached_once_per_state_and_counted_in_nbytes() -> None:
    compiled = dfa_of(compile_constraint("regex", "[ab]+c", VOCAB))
    before = compiled.nbytes
    row = compiled.start()
    first = row.allowed()
    row.allowed()
    assert compiled.masks_cached == 1 and compiled.nbytes == before + (SIZE + 7) // 8
    first[:] = False  # a caller's copy: the cache is untouched
    assert row.allowed().any()


def test_allowed_is_a_bool_array_of_the_vocabulary_size() -> None:
    allowed = compile_constraint("regex", "a", VOCAB).start().allowed()
    assert allowed.dtype == np.bool_ and allowed.shape == (SIZE,)


# Choice


def test_random_walks_through_a_choice_end_in_one_of_the_options() -> None:
    options = ["a", "ab", "abc", "b c", "the end", "日本", "-0"]
    compiled = compile_constraint("choice", options, VOCAB)
    outputs = {random_walk(compiled, seed, greed=0.0)[0].decode() for seed in range(200)}
    assert outputs <= set(options) and len(outputs) >= 5


@pytest.mark.parametrize("options", [[], [""], ["a", ""], "abc", ["a", 3], ["\ud800"]])
def test_a_malformed_choice_is_choice_invalid(options: list[str]) -> None:
    assert raises("choice", options, "CHOICE_INVALID").field == "choice"


def test_a_choice_past_its_limits_is_constraint_too_large() -> None:
    raises("choice", ["x"] * 11, "CONSTRAINT_TOO_LARGE", Limits(max_choices=10))
    raises("choice", ["x" * 6, "y" * 6], "CONSTRAINT_TOO_LARGE", Limits(max_choice_bytes=10))


# compile_constraint and the cache


def test_an_unknown_kind_is_invalid_input() -> None:
    assert raises("lark", "x", "CONSTRAINT_KIND_UNKNOWN").field == "kind"


def test_a_grammar_compiles_through_compile_constraint_and_allows_only_its_language() -> None:
    row = compile_constraint("grammar", 'root ::= "a" | "b"', VOCAB).start()
    allowed = {i for i in np.flatnonzero(row.allowed())}
    assert allowed and all(VOCAB.pieces[i] in (b"a", b"b") for i in allowed)


def test_the_cache_returns_one_compiled_constraint_per_spec_and_counts_hits() -> None:
    cache = ConstraintCache(VOCAB)
    first = cache.get("regex", "a+")
    assert cache.get("regex", "a+") is first and cache.get("choice", ["a", "b"]) is not first
    assert cache.get("choice", ("a", "b")) is cache.get("choice", ["a", "b"])
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.entries) == (3, 2, 2) and stats.compile_seconds > 0


def test_the_cache_evicts_the_least_recently_used_past_its_byte_budget() -> None:
    one = compile_constraint("regex", "a", VOCAB).nbytes
    cache = ConstraintCache(VOCAB, max_bytes=int(one * 2.5))
    a = cache.get("regex", "a")
    cache.get("regex", "b")
    cache.get("regex", "a")
    cache.get("regex", "c")  # "b" is the least recently used
    assert cache.get("regex", "a") is a and cache.stats().evictions == 1
    cache.get("regex", "b")
    assert cache.stats().misses == 4


def test_concurrent_requests_for_one_spec_compile_it_once() -> None:
    compiles = []

    def slow(kind: str, spec: object, vocabulary: Vocabulary, limits: Limits) -> object:
        compiles.append(spec)
        time.sleep(0.1)
        return compile_constraint(kind, spec, vocabulary, limits)  # type: ignore[arg-type]

    cache = ConstraintCache(VOCAB, compile=slow)  # type: ignore[arg-type]
    results: list[object] = []
    threads = [threading.Thread(target=lambda: results.append(cache.get("regex", "x+"))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert compiles == ["x+"] and len(results) == 8 and all(r is results[0] for r in results)


def test_a_failing_spec_fails_again_without_compiling() -> None:
    cache = ConstraintCache(VOCAB)
    for _ in range(3):
        with pytest.raises(InvalidInput):
            cache.get("regex", "(a)\\1")
    stats = cache.stats()
    assert (stats.misses, stats.hits, stats.entries) == (1, 2, 0)


def test_a_row_of_an_evicted_constraint_keeps_working() -> None:
    cache = ConstraintCache(VOCAB, max_bytes=1)
    row = cache.get("regex", "ab").start()
    cache.get("regex", "cd")
    row.advance(PIECES.index(b"ab"))
    assert row.accepts and isinstance(row, AutomatonRow)


def test_nbytes_can_be_read_from_another_thread_while_rows_add_masks() -> None:
    """The constraint cache sums nbytes on request threads while the engine's rows reach new states
    (CI once failed a request with "dictionary changed size during iteration")."""
    compiled = dfa_of(compile_constraint("regex", "[a-c]{0,40}", VOCAB))
    stop, errors, reads = threading.Event(), [], [0]

    def read() -> None:
        try:
            while not stop.is_set():
                reads[0] = max(reads[0], compiled.nbytes)
        except Exception as exc:  # noqa: BLE001 -- the failure under test
            errors.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        compiled.warm()
    finally:
        stop.set()
        reader.join()
    sizes = sum(compiled.mask(state).packed.nbytes for state in range(1, len(compiled.dfa.accepting)))
    assert not errors and compiled.masks_cached > 1 and reads[0] > 0
    assert compiled.nbytes == compiled.dfa.nbytes + sizes + len(compiled._moves) * MOVE_BYTES
