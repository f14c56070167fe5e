"""JSON Schema's scalar keywords as syntax trees: numbers (bounds, multipleOf) and strings
(lengths, pattern, format), with what they need of a compile only its Budget. json_schema.py
calls them for "number", "integer" and "string" subschemas."""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

from engine.constrain import json_keywords as kw
from engine.constrain import json_values as jv
from engine.constrain import machines as mx
from engine.constrain import nfa, regex
from engine.constrain.budget import Budget
from engine.constrain.formats import FORMAT_LENGTHS, FORMATS, short_email
from engine.constrain.json_keywords import LOWER_BOUNDS, MATCHED, UNMATCHED, invalid, unsupported
from engine.constrain.pattern import NOTHING, Node, alt, chars, seq
from engine.errors import InvalidInput

# A maxLength above this writes strings of at most this many characters (a subset, never a string
# the schema rejects): a bound is a rule (a state) per character, and 32,767 pass the grammar's limit.
MAX_STRING_BOUND = 4096


def multiples(number: Node, schema: dict[str, Any], pointer: str, whole: bool, budget: Budget) -> Node:
    """`number`'s values that are multiples of multipleOf (absent: all of them). An integer is a
    multiple of p/q (lowest terms) when p divides it; a decimal, of p/q where q divides a power
    of ten (0.01, 2.5, 0.25), when its digits, fraction padded, are a multiple of p*10**n/q.
    Other divisors of a number (1/3) are SCHEMA_UNSUPPORTED, and so is a machine past
    mx.MAX_MULTIPLE_STATES states."""
    if "multipleOf" not in schema:
        return number
    value = schema["multipleOf"]
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise invalid(f"{pointer}/multipleOf", "multipleOf must be a number above 0")
    step = Fraction(repr(value)) if isinstance(value, float) else Fraction(value)
    places = 0
    if not whole:
        while places <= jv.MAX_FRACTION_DIGITS and 10**places % step.denominator:
            places += 1
        if places > jv.MAX_FRACTION_DIGITS:
            raise unsupported(
                f"{pointer}/multipleOf",
                f"'multipleOf' {value} on a number (a divisor whose multiples have no finite decimals)",
            )
    numerator = step.numerator * 10**places // step.denominator if not whole else step.numerator
    if whole and numerator == 1:  # every integer
        return number
    try:
        return mx.multiples(number, numerator, places, budget)
    except nfa.TooLarge as exc:
        raise unsupported(f"{pointer}/multipleOf", f"'multipleOf' {value} here ({exc})") from exc


def number(schema: dict[str, Any], pointer: str, plain: bool = False) -> Node:
    """A number; bounds that are whole numbers give jv.number_range, decimal ones (`0.5`)
    jv.decimal_range, both without an exponent (as with multipleOf), beside the exponent
    writings every one of which the bounds admit (jv.BELOW_ONE, jv.FROM_ONE). A bound with more than
    MAX_FRACTION_DIGITS fraction digits, or whose automaton passes mx.MAX_MULTIPLE_STATES
    states, is SCHEMA_UNSUPPORTED."""
    bounds = kw.bounds(schema, pointer)
    if not bounds:
        return jv.number_range(None, None) if plain or "multipleOf" in schema else jv.NUMBER
    # (value, exclusive): the tightest of each side (at equal values, the exclusive one).
    exact = {
        k: (Fraction(repr(v)) if isinstance(v, float) else Fraction(v), o) for k, (v, o) in bounds.items()
    }
    low = max([b for k, b in exact.items() if k in LOWER_BOUNDS], default=None)
    high = min(
        [b for k, b in exact.items() if k not in LOWER_BOUNDS], default=None, key=lambda b: (b[0], not b[1])
    )
    # Exponent writings where the bounds hold for every one (none beside multipleOf: its digits).
    from_one = low is None or low[0] < 1 or low == (Fraction(1), False)
    exponents = (
        []
        if plain or "multipleOf" in schema
        else [
            *([jv.BELOW_ONE] if (low is None or low[0] <= 0) and (high is None or high[0] >= 1) else []),
            *([jv.FROM_ONE] if high is None and from_one else []),
        ]
    )
    if all(b is None or b[0].denominator == 1 for b in (low, high)):
        return alt(
            jv.number_range(
                None if low is None else int(low[0]),
                None if high is None else int(high[0]),
                low is not None and low[1],
                high is not None and high[1],
            ),
            *exponents,
        )
    key = next(k for k, b in exact.items() if b[0].denominator != 1)
    try:
        return alt(
            jv.decimal_range(
                None if low is None else low[0],
                None if high is None else high[0],
                low is not None and low[1],
                high is not None and high[1],
            ),
            *exponents,
        )
    except (ValueError, nfa.TooLarge) as exc:
        raise unsupported(f"{pointer}/{key}", f"{key!r} {bounds[key][0]} on a number ({exc})") from exc


def regex_found(source: Any, pointer: str) -> Node:
    """A pattern's strings as a JSON string's inside: found anywhere unless anchored."""
    return regex.search(jv.in_string(kw.parsed(source, pointer)), jv.CHAR)


def _pattern_lengths(schema: dict[str, Any], pointer: str, lo: int, hi: int | None) -> Node:
    """A pattern with minLength/maxLength: its strings (decoded characters) where every one
    meets the lengths, none where none does; else the lengths cut the one part that varies
    (regex.within); else refused. The filler around an unanchored pattern is any character
    but a control one (those are written as escapes only in the pattern itself)."""
    found = regex.search(kw.parsed(schema["pattern"], f"{pointer}/pattern"), chars(regex.ANY))
    least, most = regex.lengths(found)
    if lo <= least and (hi is None or most is not None and most <= hi):
        kept: Node | None = found
    elif hi is not None and hi < least or most is not None and lo > most:
        return NOTHING
    else:
        kept = regex.within(found, lo, hi)
    if kept is None:
        key = "maxLength" if "maxLength" in schema else "minLength"
        raise unsupported(
            f"{pointer}/{key}",
            f"{key!r} beside a 'pattern' where it cuts more than one "
            "part of the pattern that varies in length",
        )
    return seq(jv.QUOTE, jv.in_string(kept), jv.QUOTE)


def string(schema: dict[str, Any], pointer: str, budget: Budget) -> Node:
    """A string: its pattern, format and lengths; where not written as one tree, their automata
    intersected (mx.intersection), as are the patterns of other allOf members (MATCHED).
    Patterns a `not` rules out (UNMATCHED) are taken out of the
    strings as CANONICAL_STRING writes them (so no escape can spell a match)."""
    node = _string_alone(schema, pointer, budget)
    for source in schema.get(MATCHED, []):
        try:
            node = mx.intersection(node, _pattern({"pattern": source}, pointer), budget)
        except nfa.TooLarge as exc:
            raise unsupported(f"{pointer}/pattern", f"'pattern' in two allOf members ({exc})") from exc
    unmatched = schema.get(UNMATCHED)
    if not unmatched:
        return node
    try:
        return mx.difference(
            mx.intersection(node, jv.CANONICAL_STRING, budget),
            alt(*(_pattern({"pattern": p}, f"{pointer}/not") for p in unmatched)),
            budget,
        )
    except nfa.TooLarge as exc:
        raise unsupported(f"{pointer}/not", f"'not' of a pattern here ({exc})") from exc


def _string_alone(schema: dict[str, Any], pointer: str, budget: Budget) -> Node:
    lo = kw.count(schema, "minLength", pointer, 0) or 0
    hi = kw.count(schema, "maxLength", pointer, None)
    if hi is not None and hi > MAX_STRING_BOUND >= lo:  # a column's 32767 or 65535: a subset
        hi = MAX_STRING_BOUND
    if "pattern" in schema:
        if "minLength" in schema or "maxLength" in schema:
            found = _with_lengths(
                lambda: _pattern_lengths(schema, pointer, lo, hi),
                lambda: _pattern(schema, pointer),
                lo,
                hi,
                budget,
            )
        else:
            found = _pattern(schema, pointer)
        if schema.get("format") not in FORMATS:  # other formats are annotations
            return found
        try:  # an enforced format beside: both automata at once
            return mx.intersection(found, jv.string_format(schema["format"]), budget)
        except nfa.TooLarge as exc:
            raise unsupported(f"{pointer}/format", f"'format' beside 'pattern' ({exc})") from exc
    if "format" in schema:
        try:
            return _with_lengths(
                lambda: _format(schema, pointer, lo, hi),
                lambda: jv.string_format(schema["format"]),
                lo,
                hi,
                budget,
            )
        except InvalidInput as exc:
            if exc.reason != "SCHEMA_UNSUPPORTED" or schema["format"] != "email" or hi is None or lo > 5:
                raise
            # An email's automaton with a maxLength passes the state limit: a subset, its parts
            # bounded apart (formats.short_email).
            return seq(jv.QUOTE, jv.in_string(regex.whole(short_email(hi))), jv.QUOTE)
    return jv.string(lo, hi)


def _with_lengths(
    exact: Callable[[], Node], alone: Callable[[], Node], lo: int, hi: int | None, budget: Budget
) -> Node:
    """`exact()` (a tree), or where it is refused, `alone()`'s automaton intersected with the
    strings of lo to hi characters (refused as it was past mx.MAX_MULTIPLE_STATES states)."""
    try:
        return exact()
    except InvalidInput as exc:
        if exc.reason != "SCHEMA_UNSUPPORTED":
            raise
        try:
            return mx.intersection(alone(), jv.string(lo, hi), budget)
        except nfa.TooLarge:
            raise exc from None


def _pattern(schema: dict[str, Any], pointer: str) -> Node:
    return seq(jv.QUOTE, regex_found(schema["pattern"], f"{pointer}/pattern"), jv.QUOTE)


def _format(schema: dict[str, Any], pointer: str, lo: int, hi: int | None) -> Node:
    """A format's strings; length bounds hold for all of them, none of them or (refused) some."""
    name = schema["format"]
    if not isinstance(name, str):
        raise invalid(f"{pointer}/format", "format must be a string")
    if name not in FORMATS:  # an annotation (2020-12's default): the lengths alone hold
        return jv.string(lo, hi)
    shortest, longest = FORMAT_LENGTHS[name]
    if lo <= shortest and (hi is None or longest is not None and longest <= hi):
        return jv.string_format(name)
    if hi is not None and hi < shortest or longest is not None and lo > longest:
        return NOTHING  # no string of this format has such a length
    cuts_longest = hi is not None and (longest is None or hi < longest)
    key = "maxLength" if cuts_longest else "minLength"
    lengths = f"{shortest} to {longest}" if longest is not None else f"{shortest} or more"
    raise unsupported(
        f"{pointer}/{key}",
        f"{key!r} beside 'format' {name!r} (whose strings are "
        f"{lengths} characters long) where it holds for some of them only",
    )
