"""GBNF grammar constraints (engine/constrain/gbnf.py parses, grammar.py runs): every walk through
allowed tokens ends in text an independent parser accepts (lark, or Python's json), on a small
synthetic vocabulary and on SmolLM2's; EOS only where the grammar accepts; bad grammars rejected
with positions."""

from __future__ import annotations

import json
import random
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path

import lark
import numpy as np
import pytest

from engine.constrain.grammar import CompiledGrammar, GrammarRow, compile_grammar
from engine.constrain.limits import Limits
from engine.constrain.vocabulary import Vocabulary
from engine.errors import InvalidInput
from engine.tokenizer import Tokenizer

GRAMMARS = Path(__file__).parent / "data" / "grammars"

# The same languages in lark's notation, written independently of the GBNF files.
LARK = {
    "arithmetic": r"""
        start: expr
        expr: term (" "? OP " "? term)*
        term: NUMBER | "(" " "? expr " "? ")" | "-" term
        NUMBER: /[0-9]+(\.[0-9]+)?/
        OP: /[-+*\/]/
    """,
    "items": r"""
        start: "Items:" ("\n- " item)~1..5 "\n"?
        item: /[A-Z][a-z ]{0,12}/ ("(" /[0-9]{1,3}/ ")")?
    """,
    "unicode": r"""
        start: GREETING ", " NAME "!" (" " EMOJI~1..3)? (" " NOTE)?
        GREETING: "héllo" | "こんにちは" | "¡hola" | "Grüß Gott"
        NAME: /[Α-Ωα-ω]+/ | /[\u4e00-\u9fff]{1,3}/ | "Zoë"
        EMOJI: /[\U0001F600-\U0001F64F]/ | "❤"
        NOTE: /\([^()\n]{0,8}\)/
    """,
}
EXAMPLES = {
    "arithmetic": ["1", "(2.5 + -3)*4", "-(1/2)-0.25", "((7))"],
    "items": ["Items:\n- Apple pie (12)\n- Bread", "Items:\n- A\n- B\n- C\n- D\n- E\n"],
    "unicode": ["héllo, Zoë!", "こんにちは, 日本語! 😀❤ (ça va?)", "¡hola, αβγΩ!", "Grüß Gott, 中!"],
    "json": ['{"a": [1, -2.5e+3, true, null], "b": {"c": "x\\u00e9\\n\\"y"}}', "[]", ' "日本 😀" ', "0"],
}


def reference(name: str) -> Callable[[str], object]:
    """A parser of the named language that raises on text outside it."""
    if name == "json":
        return json.loads
    return lark.Lark(LARK[name], parser="earley", lexer="dynamic_complete").parse


def gbnf(name: str) -> str:
    return (GRAMMARS / f"{name}.gbnf").read_text()


def pieces_for_tests() -> list[bytes | None]:
    """Every single byte, words the grammars use, and pieces that split multi-byte characters."""
    words = [
        '{"',
        '":',
        '",',
        '"}',
        "true",
        "null",
        "12",
        "3.",
        "e+",
        "(1",
        " + ",
        ") ",
        "Items:",
        "\n- ",
        "Apple",
        " pie",
        "ab",
        "hé",
        "llo",
        "こん",
        "にちは",
        "ü",
        "ß",
        "αβ",
        "一丁",
        "😀",
        ", ",
        "!",
    ]
    splits = [b"\xe3\x81", b"\x93\xe3", "😀".encode()[:2], "😀".encode()[2:], "é".encode()[:1]]
    return [bytes([i]) for i in range(256)] + [w.encode() for w in words] + splits + [None]


@pytest.fixture(scope="module")
def small() -> Vocabulary:
    pieces = pieces_for_tests()
    return Vocabulary(pieces, len(pieces) + 1, [len(pieces)])  # EOS is the last id


@pytest.fixture(scope="module")
def bytewise() -> Vocabulary:
    """One token per byte (id = byte) and EOS: the vocabulary that finds shortest completions."""
    return Vocabulary([bytes([i]) for i in range(256)], 257, [256])


@pytest.fixture(scope="module")
def tokenizer(default_model: Callable[..., Path]) -> Tokenizer:
    return Tokenizer(default_model("int4"))


@pytest.fixture(scope="module")
def smollm2(tokenizer: Tokenizer) -> Vocabulary:
    return Vocabulary.from_tokenizer(tokenizer, 49152, [2])


def feed(row: GrammarRow, vocabulary: Vocabulary, tokens: list[int]) -> None:
    for token in tokens:
        assert row.allowed()[token], f"token {token} ({vocabulary.pieces[token]!r}) should be allowed"
        row.advance(token)


def byte_tokens(vocabulary: Vocabulary) -> dict[int, int]:
    """byte -> the id of a token that is that one byte."""
    return {p[0]: i for i, p in enumerate(vocabulary.pieces) if p and len(p) == 1 and vocabulary.usable[i]}


def shortest_ending(text: str, prefix: bytes, bytewise: Vocabulary) -> bytes:
    """The fewest bytes that complete `prefix` (breadth first over the grammar's states)."""
    row = compile_grammar(text, bytewise).start()
    feed(row, bytewise, list(prefix))
    frontier, seen = deque([(row, b"")]), {row.state_key}
    while frontier:
        row, path = frontier.popleft()
        if row.accepts:
            return path
        for byte in np.flatnonzero(row.allowed()[:256]).tolist():
            nxt = row.copy()
            nxt.advance(byte)
            if nxt.state_key not in seen:
                seen.add(nxt.state_key)
                frontier.append((nxt, path + bytes([byte])))
    raise AssertionError(f"no way to complete {prefix!r}")


def random_walk(grammar: CompiledGrammar, vocabulary: Vocabulary, rng: random.Random, steps: int) -> bytes:
    """Up to `steps` random allowed tokens (EOS now and then where allowed), checking the row's
    invariants at each; returns the bytes so far, complete or not."""
    row, out, eos = grammar.start(), bytearray(), vocabulary.eos_ids[0]
    for _ in range(steps):
        mask = row.allowed()
        check_row_invariants(row, mask, vocabulary, rng)
        if mask[eos] and (row.done or rng.random() < 0.05):
            return bytes(out)
        token = pick(np.flatnonzero(mask & vocabulary.usable), vocabulary, rng)
        row.advance(token)
        out += vocabulary.pieces[token] or b""
    return bytes(out)


def walk_side_by_side(
    row: GrammarRow, check: GrammarRow, vocabulary: Vocabulary, rng: random.Random, steps: int
) -> None:
    """Advance two rows by the same random allowed tokens; at every step `row` allows exactly what
    `check` does."""
    for _ in range(steps):
        mask = check.allowed()
        assert np.array_equal(row.allowed(), mask)
        if not (mask & vocabulary.usable).any():
            break
        token = pick(np.flatnonzero(mask & vocabulary.usable), vocabulary, rng)
        row.advance(token)
        check.advance(token)


def pick(tokens: np.ndarray, vocabulary: Vocabulary, rng: random.Random) -> int:
    """A random first byte among the tokens', then a random token starting with it: walks that
    vary in structure, not only in which of a thousand runs of dashes they take."""
    firsts = vocabulary.matrix[tokens, 0]
    first = rng.choice(sorted(set(firsts.tolist())))
    return int(rng.choice(tokens[firsts == first].tolist()))


def check_row_invariants(
    row: GrammarRow, mask: np.ndarray, vocabulary: Vocabulary, rng: random.Random
) -> None:
    eos = vocabulary.eos_ids[0]
    assert mask.shape == (vocabulary.size,) and mask.dtype == np.bool_
    assert mask[eos] == row.accepts
    assert not row.done or np.flatnonzero(mask).tolist() == [eos]
    assert (mask & vocabulary.usable).any() or row.accepts, "a state with nothing allowed"
    refused = np.flatnonzero(~mask)
    if len(refused):
        before, token = row.state_key, int(rng.choice(refused.tolist()))
        with pytest.raises(InvalidInput):
            row.copy().advance(token)
        assert row.state_key == before


def complete_walk(name: str, vocabulary: Vocabulary, bytewise: Vocabulary, seed: int) -> str:
    """A random walk, then the shortest completion in single-byte tokens, then EOS."""
    text, rng = gbnf(name), random.Random(seed)
    grammar = compile_grammar(text, vocabulary)
    prefix = random_walk(grammar, vocabulary, rng, steps=rng.choice([5, 20, 60]))
    ending = shortest_ending(text, prefix, bytewise)
    row, singles = grammar.start(), byte_tokens(vocabulary)
    feed(row, vocabulary, tokens_of(prefix, vocabulary) + [singles[b] for b in ending])
    assert row.accepts and row.allowed()[vocabulary.eos_ids[0]]
    return (prefix + ending).decode("utf-8")  # strict: only valid UTF-8 comes out


def tokens_of(data: bytes, vocabulary: Vocabulary) -> list[int]:
    singles = byte_tokens(vocabulary)
    return [singles[b] for b in data]


@pytest.mark.parametrize("name", ["arithmetic", "json", "items", "unicode"])
def test_every_completed_walk_on_a_small_vocabulary_parses_with_the_reference(
    name: str, small: Vocabulary, bytewise: Vocabulary
) -> None:
    parse = reference(name)
    for seed in range(25):
        parse(complete_walk(name, small, bytewise, seed))


@pytest.mark.parametrize("name", ["arithmetic", "json", "items", "unicode"])
def test_every_completed_walk_on_the_smollm2_vocabulary_parses_with_the_reference(
    name: str, smollm2: Vocabulary, bytewise: Vocabulary
) -> None:
    parse = reference(name)
    for seed in range(8):
        parse(complete_walk(name, smollm2, bytewise, seed))


@pytest.mark.parametrize("name", ["arithmetic", "json", "items", "unicode"])
def test_every_example_the_reference_accepts_is_allowed_token_by_token(
    name: str, small: Vocabulary, smollm2: Vocabulary, tokenizer: Tokenizer
) -> None:
    for example in EXAMPLES[name]:
        reference(name)(example)
        for vocab, tokens in (
            (small, tokens_of(example.encode(), small)),
            (smollm2, tokenizer.encode(example)),
        ):
            row = compile_grammar(gbnf(name), vocab).start()
            feed(row, vocab, tokens)
            assert row.accepts, example


def test_a_mask_is_what_advancing_each_token_alone_allows(small: Vocabulary) -> None:
    grammar, rng = compile_grammar(gbnf("json"), small), random.Random(7)
    row = grammar.start()
    for _ in range(30):
        mask = row.allowed()
        for token in range(small.size):
            try:
                row.copy().advance(token)
                assert mask[token], token
            except InvalidInput:
                assert not mask[token], token
        row.advance(rng.choice(np.flatnonzero(mask & small.usable).tolist()))


def test_dot_and_negated_classes_allow_only_valid_utf8(bytewise: Vocabulary) -> None:
    def allowed_after(prefix: bytes) -> set[int]:
        row = compile_grammar("root ::= . | [^a-z]", bytewise).start()
        feed(row, bytewise, list(prefix))
        return set(np.flatnonzero(row.allowed()[:256]).tolist())

    assert allowed_after(b"") == set(range(0x80)) | set(range(0xC2, 0xF5))
    assert allowed_after(b"\xe0") == set(range(0xA0, 0xC0))  # no overlong forms
    assert allowed_after(b"\xed") == set(range(0x80, 0xA0))  # no surrogates
    assert allowed_after(b"\xf4") == set(range(0x80, 0x90))  # nothing past U+10FFFF
    assert allowed_after(b"\xf0\x9f\x98") == set(range(0x80, 0xC0))


def test_a_character_split_across_tokens_is_allowed_piece_by_piece(small: Vocabulary) -> None:
    grammar = compile_grammar('root ::= "😀" | "é"', small)
    first, second = ("😀".encode()[:2], "😀".encode()[2:])
    ids = {p: i for i, p in enumerate(small.pieces) if p}
    row = grammar.start()
    assert row.allowed()[ids[first]] and row.allowed()[ids["é".encode()[:1]]]
    row.advance(ids[first])
    assert np.flatnonzero(row.allowed()).tolist() == sorted([ids[second], ids[b"\x98"]])
    row.advance(ids[second])
    assert row.done and row.accepts


def test_eos_is_allowed_only_where_the_grammar_accepts(small: Vocabulary) -> None:
    eos, row = small.eos_ids[0], compile_grammar('root ::= "a"+ "b"?', small).start()
    assert not row.allowed()[eos] and not row.accepts
    with pytest.raises(InvalidInput):
        row.copy().advance(eos)
    row.advance(ord("a"))
    assert row.allowed()[eos] and row.accepts and not row.done
    row.advance(ord("b"))
    assert row.done and np.flatnonzero(row.allowed()).tolist() == [eos]
    row.advance(eos)
    assert row.done


@pytest.mark.parametrize(
    ("repeat", "counts"),
    [
        ("{3}", {3}),
        ("{2,4}", {2, 3, 4}),
        ("{2,}", {2, 3, 4, 5, 6}),
        ("*", set(range(7))),
        ("+", set(range(1, 7))),
        ("?", {0, 1}),
        ("{0,0}", {0}),
    ],
)
def test_repetition_bounds_match_exactly_those_counts(
    repeat: str, counts: set[int], bytewise: Vocabulary
) -> None:
    grammar = compile_grammar(f'root ::= ("a" "b"){repeat}', bytewise)
    assert {n for n in range(7) if walks(grammar, b"ab" * n)} == counts


def walks(grammar: CompiledGrammar, data: bytes) -> bool:
    """Whether `data`, byte by byte, is allowed and complete."""
    row = grammar.start()
    for byte in data:
        if not row.allowed()[byte]:
            return False
        row.advance(byte)
    return row.accepts


def test_escapes_stand_for_code_points_in_utf8(bytewise: Vocabulary) -> None:
    grammar = compile_grammar(r'root ::= "\x41\u00e9\U0001F600\n\t\"\\" [\x5b-\x5d\-]', bytewise)
    assert walks(grammar, 'Aé😀\n\t"\\'.encode() + b"-")
    assert walks(grammar, 'Aé😀\n\t"\\'.encode() + b"\\")
    assert not walks(grammar, 'Aé😀\n\t"\\'.encode() + b"a")


def test_comments_and_rules_across_lines_parse(bytewise: Vocabulary) -> None:
    text = """
        # a comment before anything
        root ::= greeting   # trailing comment
                 ( " " name
                 | "!" )    # the alternative on its own line
        greeting ::=
            "hi" | "yo"
        name ::= [a-z]+"""
    grammar = compile_grammar(text, bytewise)
    assert walks(grammar, b"hi bob") and walks(grammar, b"yo!") and not walks(grammar, b"hi")


@pytest.mark.parametrize(
    ("text", "where", "says"),
    [
        ("root ::= a", "line 1 column 10", "rule 'a' is not defined"),
        ('item ::= "x"', "line 1 column 1", "no rule named 'root'"),
        ('root ::= root "x" | "y"', "line 1 column 1", "left-recursive (root -> root)"),
        ('root ::= a\na ::= b "x" | "y"\nb ::= " "? a', "line 2 column 1", "left-recursive (a -> b -> a)"),
        ('root ::= ("a"?)*', "line 1 column 16", "repetition of something that can match nothing"),
        ('root ::= "x"\n  | "abc', "line 2 column 5", "unterminated string"),
        ("root ::= [a-z", "line 1 column 10", "unterminated character class"),
        ("root ::= [z-a]", "line 1 column 11", "range ends before it starts"),
        ('root ::= ("a" | "b"', "line 1 column 10", "expected ')'"),
        ('root ::= "a" )', "line 1 column 14", "unexpected ')'"),
        ('root ::= *"a"', "line 1 column 10", "nothing before it to repeat"),
        ('root ::= "a"{3,2}', "line 1 column 13", "maximum below its minimum"),
        ('root ::= "a"{x}', "line 1 column 14", "expected a repetition count"),
        (r'root ::= "\q"', "line 1 column 11", "unknown escape"),
        (r'root ::= "\u12"', "line 1 column 11", "needs 4 hex digits"),
        (r'root ::= "\uD800"', "line 1 column 11", "not a character"),
        ('root ::= "a"\nroot ::= "b"', "line 2 column 1", "defined twice"),
        ('root ::= b\nb ::= "x" b', "line 2 column 1", "matches no finite text"),
        ('root "a"', "line 1 column 6", "expected '::='"),
    ],
)
def test_bad_grammars_are_rejected_with_line_and_column(
    text: str, where: str, says: str, bytewise: Vocabulary
) -> None:
    with pytest.raises(InvalidInput) as caught:
        compile_grammar(text, bytewise)
    assert (caught.value.reason, caught.value.field) == ("GRAMMAR_INVALID", "grammar")
    assert where in str(caught.value) and says in str(caught.value), str(caught.value)


def test_a_grammar_past_the_element_bound_is_too_large(bytewise: Vocabulary) -> None:
    with pytest.raises(InvalidInput) as caught:
        compile_grammar('root ::= "abc"{100000000}', bytewise)
    assert caught.value.reason == "CONSTRAINT_TOO_LARGE"
    compile_grammar('root ::= "abc"{1000}', bytewise)  # 3000 elements fit


def test_ambiguity_past_the_stack_bound_is_too_large(bytewise: Vocabulary) -> None:
    # After n a's the pending b's may number 0..n: the parses grow with n.
    text = 'root ::= s\ns ::= "a" s "b" | "a" s | '
    row = compile_grammar(text, bytewise).start()
    for _ in range(12):
        row.advance(ord("a"))
    row = compile_grammar(text, bytewise, Limits(max_grammar_stacks=8)).start()
    with pytest.raises(InvalidInput) as caught:
        for _ in range(12):
            row.advance(ord("a"))
    assert caught.value.reason == "CONSTRAINT_TOO_LARGE"


def test_equal_parser_states_have_equal_keys_and_copies_are_independent(small: Vocabulary) -> None:
    grammar = compile_grammar('root ::= "ab" [0-9]', small)
    ids = {p: i for i, p in enumerate(small.pieces) if p}
    one, two = grammar.start(), grammar.start()
    one.advance(ids[b"a"])
    one.advance(ids[b"b"])
    assert one.state_key != two.state_key
    two.advance(ids[b"ab"])
    assert one.state_key == two.state_key and hash(one.state_key) == hash(two.state_key)
    three = one.copy()
    three.advance(ids[b"1"])
    assert one.state_key == two.state_key != three.state_key
    other = compile_grammar('root ::= "ab" [0-9]', small).start()
    assert other.state_key != grammar.start().state_key  # keys never collide across grammars


def test_masks_are_fresh_arrays_and_their_cache_is_counted(small: Vocabulary) -> None:
    grammar = compile_grammar(gbnf("json"), small)
    row, empty = grammar.start(), grammar.nbytes
    mask = row.allowed()
    mask[:] = False
    assert row.allowed().any() and grammar.nbytes > empty


def test_masks_stay_exact_when_the_transition_table_starts_again(small: Vocabulary) -> None:
    tight = compile_grammar(gbnf("json"), small, Limits(max_grammar_states=3, max_grammar_masks=2))
    roomy, rng = compile_grammar(gbnf("json"), small), random.Random(3)
    one, two = tight.start(), roomy.start()
    for _ in range(60):
        mask = two.allowed()
        assert np.array_equal(one.allowed(), mask)
        token = pick(np.flatnonzero(mask & small.usable), small, rng)
        one.advance(token)
        two.advance(token)


def test_compile_constraint_hands_grammars_to_this_compiler(small: Vocabulary) -> None:
    from engine.constrain import compile_constraint

    compiled = compile_constraint("grammar", 'root ::= "ab" [0-9]', small)
    row = compiled.start()
    assert isinstance(compiled, CompiledGrammar) and compiled.nbytes > 0
    row.advance(small.pieces.index(b"ab"))
    assert not row.accepts and row.allowed()[ord("7")]


def states_one_token_from_the_start(grammar: CompiledGrammar, vocabulary: Vocabulary) -> list[GrammarRow]:
    rows = []
    for token in np.flatnonzero(grammar.start().allowed() & vocabulary.usable).tolist():
        row = grammar.start()
        row.advance(token)
        rows.append(row)
    return rows


def test_a_grammar_warm_up_caches_the_masks_of_the_start_state_and_the_states_one_token_on(
    small: Vocabulary,
) -> None:
    grammar = compile_grammar(gbnf("arithmetic"), small)
    computed = grammar.warm()
    assert computed == grammar.masks_cached > 1
    for row in [grammar.start(), *states_one_token_from_the_start(grammar, small)]:
        row.allowed()
    assert grammar.masks_cached == computed, "a row computed a mask the warm-up should have"


def test_warmed_masks_are_the_masks_rows_compute_themselves(small: Vocabulary) -> None:
    warmed, cold = compile_grammar(gbnf("json"), small), compile_grammar(gbnf("json"), small)
    assert warmed.warm() > 0
    walk_side_by_side(warmed.start(), cold.start(), small, random.Random(11), 80)


def test_a_grammar_warm_up_is_bounded_and_stops_when_asked(small: Vocabulary) -> None:
    bounded = compile_grammar(gbnf("json"), small, Limits(max_grammar_warm=5))
    assert bounded.warm() == bounded.masks_cached == 5
    assert bounded.warm() == 0  # what is cached is not computed again
    stopped = threading.Event()
    stopped.set()
    assert compile_grammar(gbnf("json"), small).warm(stopped) == 0


def test_a_warm_up_beside_rows_on_other_threads_leaves_every_mask_exact(small: Vocabulary) -> None:
    grammar, reference_grammar = compile_grammar(gbnf("json"), small), compile_grammar(gbnf("json"), small)
    warming = threading.Thread(target=grammar.warm)
    warming.start()
    walk_side_by_side(grammar.start(), reference_grammar.start(), small, random.Random(5), 120)
    warming.join()


def test_grammar_nbytes_counts_exactly_the_masks_it_holds_through_evictions(small: Vocabulary) -> None:
    """nbytes is kept as masks come and go (request threads read it while rows add masks), so it
    equals the rules, the table and the masks held, also after the oldest masks are dropped."""
    grammar = compile_grammar(gbnf("json"), small, Limits(max_grammar_masks=3))
    empty = grammar.nbytes
    rows = states_one_token_from_the_start(grammar, small)
    for row in rows:
        row.allowed()
    held = sum(mask.nbytes for mask in grammar._masks.values())
    assert len(rows) > 3 and grammar.masks_cached == 3
    assert grammar.nbytes == grammar._program.nbytes + grammar._transitions.nbytes + held > empty
