"""engine/constrain/json_schema.py: every output a JSON schema constraint allows is JSON that
validates, on a synthetic vocabulary and on the default model's; what it cannot honour it
refuses, naming the keyword's JSON pointer."""

from __future__ import annotations

import datetime
import itertools
import json
import re
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

from engine.constrain import Limits, Vocabulary, compile_constraint
from engine.constrain.grammar import CompiledGrammar
from engine.constrain.json_disjoint import disjoint
from engine.errors import InvalidInput
from engine.tokenizer import Tokenizer
from tests.engine.test_constraints import VOCAB, accepts, random_walk

CORPUS = json.loads((Path(__file__).parent / "data" / "schemas.json").read_text())
FORMATS = jsonschema.Draft202012Validator.FORMAT_CHECKER


@FORMATS.checks("date-time")
def _date_time(value: object) -> bool:
    return not isinstance(value, str) or datetime.datetime.fromisoformat(value) is not None


@FORMATS.checks("time", raises=ValueError)
def _time(value: object) -> bool:
    return not isinstance(value, str) or datetime.time.fromisoformat(value) is not None


def corpus(name: str) -> Any:
    return next(e["schema"] for e in CORPUS if e["name"] == name)


def schema_of(schema: Any) -> Any:
    return compile_constraint("json_schema", json.dumps(schema), VOCAB)


def check_walks(schema: Any, compiled: Any, seeds: range) -> list[Any]:
    validator = jsonschema.Draft202012Validator(schema, format_checker=FORMATS)
    values = []
    for seed in seeds:
        out, _ = random_walk(compiled, seed)
        value = json.loads(out.decode("utf-8"))
        validator.validate(value)
        values.append(value)
    return values


def refused(schema: Any, reason: str, limits: Limits | None = None) -> InvalidInput:
    text = schema if isinstance(schema, str) else json.dumps(schema)
    with pytest.raises(InvalidInput) as caught:
        compile_constraint("json_schema", text, VOCAB, limits or Limits())
    assert caught.value.reason == reason and caught.value.field == "json_schema", str(caught.value)
    return caught.value


@pytest.mark.parametrize("entry", CORPUS, ids=[e["name"] for e in CORPUS])
def test_random_walks_through_every_corpus_schema_are_json_that_validates(entry: dict[str, Any]) -> None:
    check_walks(entry["schema"], schema_of(entry["schema"]), range(15))


def test_the_corpus_holds_forty_schemas_or_more() -> None:
    assert len(CORPUS) >= 40


@pytest.mark.parametrize(
    ("schema", "pointer"),
    [
        (
            {"type": "object", "properties": {"x": {"type": "number", "multipleOf": 0.3333}}},
            "/properties/x/multipleOf",
        ),
        ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "/uniqueItems"),
        (
            {"type": "array", "items": {"enum": ["a", "b"]}, "uniqueItems": True, "minItems": 2},
            "/uniqueItems",
        ),
        ({"type": "string", "not": {"minLength": 3}}, "/not"),
        ({"type": "object", "not": {"required": ["a"]}}, "/not"),
        ({"type": "object", "patternProperties": {"^x": {}}, "maxProperties": 3}, "/maxProperties"),
        ({"type": "array", "prefixItems": [{"type": "string"}], "uniqueItems": True}, "/uniqueItems"),
        ({"type": "object", "minProperties": 2}, "/minProperties"),
        (
            {"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a"], "minProperties": 2},
            "/minProperties",
        ),
        ({"type": "object", "properties": {"a": {}, "b": {}}, "maxProperties": 1}, "/maxProperties"),
        (
            {"$defs": {"a": {"type": "array", "contains": {}, "maxContains": 2}}, "$ref": "#/$defs/a"},
            "/$defs/a/maxContains",
        ),
        (
            {"type": "object", "propertyNames": {"maxLength": 3}, "patternProperties": {"^x": {}}},
            "/propertyNames",
        ),
        ({"$ref": "https://example.com/schema.json"}, "/$ref"),
        ({"dependentRequired": {"bar": ["foo"]}}, "/dependentRequired/bar"),
        (
            {"allOf": [{"properties": {"foo": {}}}, {"unevaluatedProperties": False}]},
            "/allOf/1/unevaluatedProperties",
        ),
        (
            {"$defs": {"a": {"unevaluatedProperties": False}}, "properties": {"p": {}}, "$ref": "#/$defs/a"},
            "/$defs/a/unevaluatedProperties",
        ),
        (
            {
                "type": "object",
                "properties": {"a": {}},
                "patternProperties": {"^b": {}},
                "dependentSchemas": {"bar": {"required": ["a"]}},
            },
            "/dependentSchemas/bar",
        ),
        ({"$ref": "#foo", "$defs": {"a": {"$anchor": "foo", "type": "integer"}}}, "/$ref"),
        (
            {"allOf": [{"$ref": "#foo"}], "definitions": {"a": {"$id": "#foo", "type": "integer"}}},
            "/allOf/0/$ref",
        ),
        ({"allOf": [{"type": "string", "maxLength": 4}, {"maxLength": 3}]}, "/allOf/1/maxLength"),
        (
            {"allOf": [{"properties": {"a": {}}, "additionalProperties": False}, {"properties": {"b": {}}}]},
            "/allOf/1/additionalProperties",
        ),
        ({"type": "number", "minimum": 1.2345678901234567e-10}, "/minimum"),
        ({"type": "string", "pattern": "^[a-z]+-[0-9]+$", "maxLength": 30_000}, "/maxLength"),
        ({"type": "string", "pattern": "(a)\\1"}, "/pattern"),
        ({"type": "string", "pattern": "^\\p{Letter}+$"}, "/pattern"),
        ({"allOf": [{"items": [{"type": "string"}]}, {"items": {"type": "string"}}]}, "/allOf/1/items"),
        ({"enum": [{"a": 1}], "properties": {"a": {}}}, "/properties"),
        (
            {
                "type": "object",
                "properties": {"a/b": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
            },
            "/properties/a~1b/uniqueItems",
        ),
    ],
)
def test_an_unsupported_keyword_is_refused_naming_its_json_pointer(schema: Any, pointer: str) -> None:
    assert str(refused(schema, "SCHEMA_UNSUPPORTED")).startswith(f"{pointer}: ")


@pytest.mark.parametrize(
    ("text", "pointer"),
    [
        ("{not json", ""),
        ('{"type": "string"', ""),
        ('{"maximum": NaN}', ""),
        ('{"type": "strin"}', "/type"),
        ('{"type": "string", "minLength": -1}', "/minLength"),
        ('{"enum": []}', "/enum"),
        ('{"$ref": "#/$defs/missing"}', "/$ref"),
        ("[1]", "/"),
        ('{"type": "integer", "minimum": "3"}', "/minimum"),
        ('{"type": "string", "pattern": "(a"}', "/pattern"),
    ],
)
def test_a_schema_that_is_not_valid_is_schema_invalid(text: str, pointer: str) -> None:
    assert pointer in str(refused(text, "SCHEMA_INVALID"))


def test_whitespace_is_at_most_one_space_after_a_colon_or_a_comma() -> None:
    compiled = schema_of(
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "array"}},
            "required": ["a", "b"],
        }
    )
    for text in ['{"a": 1, "b": [1, 2]}', '{"a":1,"b":[1,2]}', '{"a": 1,"b":[]}']:
        assert accepts(compiled, text.encode()), text
    for text in [
        '{ "a":1,"b":[]}',
        '{"a":  1,"b":[]}',
        '{"a":1,"b":[] }',
        '{"a" :1,"b":[]}',
        '{"a":1,"b":[ 1]}',
        '{"a":1,"b":[]}\n',
        ' {"a":1,"b":[]}',
        '{"a":1,\n"b":[]}',
    ]:
        assert not accepts(compiled, text.encode()), text


def test_declared_properties_come_in_any_order_each_at_most_once_with_the_required_ones() -> None:
    compiled = schema_of(
        {
            "properties": {"a": {"const": 1}, "b": {"const": 2}, "c": {"const": 3}},
            "required": ["b"],
            "additionalProperties": False,
        }
    )
    values = {"a": 1, "b": 2, "c": 3}
    for size in range(4):
        for names in itertools.permutations(values, size):
            text = json.dumps({n: values[n] for n in names}, separators=(",", ":"))
            assert accepts(compiled, text.encode()) == ("b" in names), text
    for text in [
        '{"b":2,"b":2}',
        '{"a":1,"b":2,"a":1}',
        '{"b":2,}',
        '{,"b":2}',
        '{"b":2,"d":4}',
        '{"b":2"a":1}',
    ]:
        assert not accepts(compiled, text.encode()), text


def test_an_object_of_forty_properties_admits_them_in_any_order_on_the_pushdown_engine() -> None:
    names = [f"p{i}" for i in range(40)]
    schema = {
        "type": "object",
        "properties": {n: {"type": "integer"} for n in names},
        "required": names[::7],
        "additionalProperties": False,
    }
    compiled = schema_of(schema)
    assert isinstance(compiled, CompiledGrammar)
    rng = np.random.default_rng(7)
    for _ in range(12):
        chosen = [str(n) for n in rng.permutation(names)[: int(rng.integers(0, 41))]]
        text = json.dumps({n: 1 for n in chosen}, separators=(",", ":")).encode()
        assert accepts(compiled, text) == (set(names[::7]) <= set(chosen)), text
    everything = [str(n) for n in rng.permutation(names)]
    assert accepts(compiled, json.dumps(dict.fromkeys(everything, 0)).encode())
    assert not accepts(compiled, json.dumps(dict.fromkeys(everything, 0))[:-1].encode() + b', "p3": 1}')
    check_walks(schema, compiled, range(4))


def test_absent_additional_properties_admits_others_anywhere_as_the_spec_reads_it() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "ab": {"type": "string"}},
        "required": ["a"],
    }
    spec, strict = schema_of(schema), compile_constraint("json_schema_strict", json.dumps(schema), VOCAB)
    for text in ['{"a":1}', '{"a":1,"ab":"x"}', '{"ab":"x","a":1}']:
        assert accepts(spec, text.encode()) and accepts(strict, text.encode()), text
    for text in [
        '{"a":1,"b":[{"c":null}]}',
        '{"a":1,"ab":"x","abc":2,"é":{}}',
        '{"a": 1, "x": "y", "": 0}',
        '{"$schema":"s","a":1}',
        '{"x":1,"a":1,"y":2,"ab":"y","z":3}',
    ]:
        assert accepts(spec, text.encode()) and not accepts(strict, text.encode()), text
    # Others' keys are plain and none can spell (or escape) a declared name; the required ones
    # are written, each declared one once.
    for text in [
        '{"x":1}',
        '{"a":1,"a":2}',
        '{"a":1,"ab":3}',
        '{"a":1,"\\u0061b":3}',
        '{"x":1,"a":1,"x":2,"a":1}',
    ]:
        assert not accepts(spec, text.encode()), text


def test_an_explicit_additional_properties_holds_in_either_reading() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "additionalProperties": {"type": "null"},
    }
    for kind in ("json_schema", "json_schema_strict"):
        compiled = compile_constraint(kind, json.dumps(schema), VOCAB)
        assert accepts(compiled, b'{"a":1,"b":null}') and not accepts(compiled, b'{"a":1,"b":1}'), kind
    closed = schema_of({**schema, "additionalProperties": False})
    assert accepts(closed, b'{"a":1}') and not accepts(closed, b'{"a":1,"b":null}')


def test_a_schema_without_type_admits_every_type_its_keywords_do_not_restrict() -> None:
    compiled = schema_of(
        {
            "properties": {"a": {"type": "integer"}},
            "required": ["a"],
            "minLength": 2,
            "minimum": 3,
            "additionalProperties": False,
        }
    )
    for text in ['{"a":1}', '"ab"', "3", "4.5", "true", "null", "[1,{}]"]:
        assert accepts(compiled, text.encode()), text
    for text in ['{"a":"1"}', "{}", '"a"', "2", "-4.5"]:
        assert not accepts(compiled, text.encode()), text


@pytest.mark.parametrize(
    ("bounds", "low", "high"),
    [
        ({"minimum": 0}, 0, None),
        ({"minimum": -15, "maximum": 7}, -15, 7),
        ({"maximum": -3}, None, -3),
        ({"exclusiveMinimum": 9, "exclusiveMaximum": 101}, 10, 100),
        ({"minimum": 1.5, "maximum": 99.5}, 2, 99),
        ({"minimum": 37, "maximum": 2048}, 37, 2048),
        ({"minimum": 5, "maximum": 4}, 5, 4),
    ],
)
def test_integer_bounds_admit_exactly_the_integers_between_them(
    bounds: dict[str, float], low: int | None, high: int | None
) -> None:
    schema = {"type": "integer", **bounds}
    if low is not None and high is not None and low > high:
        refused(schema, "CONSTRAINT_UNSATISFIABLE")
        return
    compiled = schema_of(schema)
    for value in range(-3000, 3000):
        inside = (low is None or value >= low) and (high is None or value <= high)
        assert accepts(compiled, str(value).encode()) == inside, value
    assert not accepts(compiled, b"007") and not accepts(compiled, b"1.0")


@pytest.mark.parametrize(
    "bounds",
    [
        {"minimum": 0},
        {"minimum": -2, "exclusiveMaximum": 3},
        {"exclusiveMinimum": -90, "maximum": 90},
        {"minimum": 0, "maximum": 1},
        {"maximum": -1},
        {"minimum": 0.0, "maximum": 100.0},
        {"minimum": 5, "exclusiveMinimum": True},  # draft 4: a boolean makes minimum exclusive
    ],
)
def test_whole_bounds_on_a_number_admit_exactly_the_decimals_between_them(bounds: dict[str, Any]) -> None:
    """Every plain decimal is judged by its value; an exponent writing is admitted only where valid."""
    compiled = schema_of({"type": "number", **bounds})
    validator = (
        jsonschema.Draft4Validator
        if isinstance(bounds.get("exclusiveMinimum"), bool)
        else jsonschema.Draft202012Validator
    )
    check = validator({"type": "number", **bounds})
    fractions = ["", ".0", ".00", ".5", ".05", ".999", ".001"]
    for whole in range(-100, 102):
        for fraction in fractions:
            text = f"{whole}{fraction}"
            assert accepts(compiled, text.encode()) == check.is_valid(Decimal(text)), text
    for text in ["-0.5", "-0.001", "0.25"]:
        assert accepts(compiled, text.encode()) == check.is_valid(Decimal(text)), text
    assert not accepts(compiled, b"1e1") or check.is_valid(10)
    assert not accepts(compiled, b"01.5")
    check_walks(
        {"type": "number", **bounds}
        if validator is jsonschema.Draft202012Validator
        else {"type": "number", "minimum": 5},
        compiled,
        range(20),
    )


def test_a_declared_property_a_pattern_finds_holds_both_schemas_and_is_written_once() -> None:
    schema = {
        "type": "object",
        "properties": {"by": {"type": "string"}, "n": {"type": "integer"}},
        "patternProperties": {"^b": {"minLength": 2}},
        "additionalProperties": False,
    }
    compiled = schema_of(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for instance in [
        {"by": "ab"},
        {"by": "a"},
        {"by": 3},
        {"by": "ab", "bx": "cd"},
        {"bx": "c"},
        {"n": 1, "bz": 5},
        {"n": 1, "q": 2},
    ]:
        text = json.dumps(instance, separators=(",", ":")).encode()
        assert accepts(compiled, text) == validator.is_valid(instance), text
    assert not accepts(compiled, b'{"by":"ab","by":"cd"}')


@pytest.mark.parametrize(
    "schema",
    [
        {
            "type": "object",
            "patternProperties": {"^[a-c]$": {"type": "integer"}},
            "minProperties": 1,
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {"a": {}},
            "patternProperties": {"^b": {"type": "integer"}},
            "minProperties": 1,
        },
        {"type": "object", "properties": {"a": {}, "b": {"type": "integer"}}, "minProperties": 1},
        {
            "type": "object",
            "properties": {"a": {}, "b": {"type": "integer"}},
            "minProperties": 1,
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {"a": {}, "b": {"type": "integer"}, "d": {}},
            "patternProperties": {"^c": {"type": "integer"}},
            "minProperties": 1,
            "additionalProperties": False,
        },
    ],
)
def test_min_properties_one_with_nothing_required_writes_one_member_at_least(schema: Any) -> None:
    compiled = schema_of(schema)
    validator = jsonschema.Draft202012Validator(schema)
    instances = [{}, {"a": 1}, {"b": 2}, {"a": 1, "b": 2}, {"c": 3}, {"b": "x"}, {"a": None, "c": 1}]
    instances += [{"b": 2, "a": 1}, {"d": 1, "b": 2, "a": 0}, {"b": 2, "a": 1, "c": 3}]
    instances += [{"c": 3, "a": 1}, {"d": 1, "c": 3, "b": 2}]
    for instance in instances:
        text = json.dumps(instance, separators=(",", ":")).encode()
        assert accepts(compiled, text) == validator.is_valid(instance), text


@pytest.mark.parametrize(
    "schema",
    [
        {
            "type": "object",
            "patternProperties": {"^x": {"type": "integer"}, "y$": {"minimum": 5}},
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {"xy": {"maximum": 9}},
            "patternProperties": {"^x": {"type": "integer"}, "y$": {"minimum": 5}, "^q": {"type": "string"}},
        },
    ],
)
def test_patterns_with_different_schemas_give_a_key_every_schema_of_the_patterns_that_find_it(
    schema: Any,
) -> None:
    compiled = schema_of(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for instance in [
        {"xa": 1},
        {"xa": 1.5},
        {"ay": 3},
        {"ay": 7},
        {"ay": "s"},
        {"xy": 7},
        {"xy": 3},
        {"xy": 7.5},
        {"xy": 12},
        {"q": "s"},
        {"q": 1},
        {"z": 1},
        {"xy": 5, "xa": 2, "ay": 6},
    ]:
        text = json.dumps(instance, separators=(",", ":")).encode()
        assert accepts(compiled, text) == validator.is_valid(instance), text


def test_an_all_of_of_one_recursive_ref_recurses_as_the_ref_does() -> None:
    kids = {"type": "array", "items": {"allOf": [{"$ref": "#/$defs/n"}]}}
    item = {
        "type": "object",
        "properties": {"v": {"type": "integer"}, "kids": kids},
        "required": ["v"],
        "additionalProperties": False,
    }
    compiled = schema_of({"$defs": {"n": item}, "$ref": "#/$defs/n"})
    deep: dict[str, Any] = {"v": 0}
    for level in range(1, 12):
        deep = {"v": level, "kids": [deep]}
    assert accepts(compiled, json.dumps(deep, separators=(",", ":")).encode())
    assert not accepts(compiled, b'{"v":1,"kids":[{"kids":[]}]}')


def test_an_any_of_in_two_all_of_members_admits_what_meets_one_alternative_of_each() -> None:
    schema = {
        "allOf": [
            {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}]},
            {"anyOf": [{"minimum": 5}, {"minLength": 1}]},
        ]
    }
    compiled = schema_of(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for instance in [3, 7, "", "a", "abc", 5.5, None]:
        text = json.dumps(instance).encode()
        assert accepts(compiled, text) == validator.is_valid(instance), text


def test_pattern_properties_add_members_whose_keys_a_pattern_finds() -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}},
        "required": ["name"],
        "patternProperties": {"^x-": {"type": "integer"}},
        "additionalProperties": False,
    }
    compiled = schema_of(schema)
    for text in [
        '{"name":"a"}',
        '{"name":"a","x-b":1}',
        '{"name":"a", "x-b":1, "x-":-2}',
        '{"x-b":1,"name":"a"}',
    ]:
        assert accepts(compiled, text.encode()), text
    for text in [
        '{"name":"a","y":1}',
        '{"name":"a","x-b":"s"}',
        '{"x-b":1}',
        '{"name":"a",}',
        '{"name":"a","name":"a"}',
        '{"name":"a","ax-":1}',
    ]:
        assert not accepts(compiled, text.encode()), text
    check_walks(schema, compiled, range(30))
    a_map = {"type": "object", "patternProperties": {"^[a-z]+$": {"type": "boolean"}}}
    compiled = schema_of(a_map)
    for text in ["{}", '{"on":true}', '{"on":true,"off":false}']:
        assert accepts(compiled, text.encode()), text
    assert accepts(compiled, b'{"on":true,"On":1}')  # others: additionalProperties is absent
    assert not accepts(compiled, b'{"on":1}')  # a key a pattern finds takes that pattern's schema
    check_walks(a_map, compiled, range(30))
    closed = schema_of({**a_map, "additionalProperties": False})
    assert accepts(closed, b'{"on":true}') and not accepts(closed, b'{"On":true}')
    typed = schema_of({**a_map, "additionalProperties": {"type": "string"}})
    assert accepts(typed, b'{"on":true,"On":"s"}') and not accepts(typed, b'{"On":true}')


@pytest.mark.parametrize(
    ("pattern", "lengths"),
    [
        ("^[ab]+$", {"maxLength": 4}),
        ("^[ab]+$", {"minLength": 2, "maxLength": 3}),
        ("^a", {"maxLength": 3}),
        ("b$", {"minLength": 2, "maxLength": 4}),
        ("^a[ab]*1$", {"minLength": 3, "maxLength": 5}),
        ("^(ab|1)$", {"maxLength": 5}),
        ("^[ab]{2}$", {"minLength": 3}),
    ],
)
def test_lengths_beside_a_pattern_admit_exactly_the_strings_that_meet_both(
    pattern: str, lengths: dict[str, int]
) -> None:
    schema = {"type": "string", "pattern": pattern, **lengths}
    lo, hi = lengths.get("minLength", 0), lengths.get("maxLength", 99)
    expected = [
        w
        for n in range(7)
        for w in map("".join, itertools.product("ab1", repeat=n))
        if re.search(pattern, w) and lo <= len(w) <= hi
    ]
    if not expected:
        refused(schema, "CONSTRAINT_UNSATISFIABLE")
        return
    compiled = schema_of(schema)
    for n in range(7):
        for word in map("".join, itertools.product("ab1", repeat=n)):
            assert accepts(compiled, json.dumps(word).encode()) == (word in expected), word
    check_walks(schema, compiled, range(20))


PAIR = {"a": {"type": "integer"}, "b": {"type": "integer"}}


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": PAIR, "not": {"required": ["a", "b"]}},
        {"type": "object", "properties": PAIR, "required": ["a"], "not": {"anyOf": [{"required": ["b"]}]}},
        {"type": ["string", "null"], "not": {"type": "null"}},
        {"properties": PAIR, "not": {"type": ["array", "string"]}},
        {
            "type": "object",
            "properties": {"kind": {"enum": ["a", "b"]}, "x": {"type": "integer"}},
            "if": {"properties": {"kind": {"const": "a"}}},
            "then": {"required": ["x"]},
        },
        {
            "type": "object",
            "properties": {"kind": {"enum": ["a", "b"]}, "x": {"type": "integer"}},
            "if": {"properties": {"kind": {"const": "a"}}, "required": ["kind"]},
            "then": {"required": ["x"]},
            "else": {"properties": {"x": {"maximum": 0}}},
        },
        {"type": "object", "properties": PAIR, "dependencies": {"a": ["b"]}},
        {
            "type": "object",
            "properties": PAIR,
            "required": ["a"],
            "dependencies": {"a": {"properties": {"b": {"minimum": 0}}}, "b": False},
        },
        {"type": "object", "properties": PAIR, "dependentRequired": {"b": ["a"]}},
        {"allOf": [{"type": "object", "properties": PAIR}], "dependentRequired": {"b": ["a"]}},
        {
            "$defs": {"p": {"type": "object", "properties": PAIR}},
            "$ref": "#/$defs/p",
            "not": {"required": ["a"]},
        },
    ],
)
def test_conditions_negations_and_dependencies_admit_only_outputs_that_validate(schema: Any) -> None:
    """if/then/else, not and dependencies are written as the other keywords, keeping all or part of
    what they allow: every walk validates (draft 7 and 2020-12 agree on these schemas)."""
    compiled = schema_of(schema)
    values = check_walks(schema, compiled, range(40))
    assert jsonschema.Draft7Validator(schema).is_valid(values[0]) or "dependentRequired" in schema
    assert len({json.dumps(v) for v in values}) > 1


def test_not_of_required_leaves_one_optional_name_out_whichever_it_is() -> None:
    compiled = schema_of({"type": "object", "properties": PAIR, "not": {"required": ["a", "b"]}})
    for text in ["{}", '{"a":1}', '{"b":2}']:
        assert accepts(compiled, text.encode()), text
    for text in ['{"a":1,"b":2}']:
        assert not accepts(compiled, text.encode()), text
    refused(
        {"type": "object", "properties": PAIR, "required": ["a", "b"], "not": {"required": ["a", "b"]}},
        "CONSTRAINT_UNSATISFIABLE",
    )


def test_conditions_in_several_all_of_members_each_hold_their_then() -> None:
    schema = {
        "type": "object",
        "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
        "allOf": [
            {"if": {"required": ["a"]}, "then": {"required": ["x"]}},
            {"if": {"required": ["b"]}, "then": {"required": ["y"]}},
        ],
    }
    compiled = schema_of(schema)
    assert accepts(compiled, b'{"x":1,"y":2}') and not accepts(compiled, b'{"x":1}')
    check_walks(schema, compiled, range(10))


def test_unique_items_over_an_enum_choose_each_value_at_most_once_in_the_enum_s_order() -> None:
    schema = {"type": "array", "items": {"enum": ["a", "b", 3, "a"]}, "uniqueItems": True}
    compiled = schema_of(schema)
    for text in ["[]", '["a"]', '["a",3]', '["a", "b", 3]', "[3]"]:
        assert accepts(compiled, text.encode()), text
    for text in ['["b","a"]', '["a","a"]', "[3,3]", '["c"]']:
        assert not accepts(compiled, text.encode()), text
    check_walks(schema, compiled, range(20))
    non_empty = schema_of({**schema, "minItems": 1})
    assert not accepts(non_empty, b"[]") and accepts(non_empty, b'["b"]')


@pytest.mark.parametrize(
    "schema",
    [
        {
            "type": "object",
            "propertyNames": {"pattern": "^[a-z]+$"},
            "additionalProperties": {"type": "integer"},
        },
        {
            "type": "object",
            "properties": {"ab": {"type": "integer"}, "Cd": {"type": "integer"}},
            "propertyNames": {"$ref": "#/$defs/lower"},
            "$defs": {"lower": {"pattern": "^[a-z]+$", "maxLength": 3}},
        },
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "required": ["a", "b"],
            "unevaluatedProperties": {"type": "boolean"},
        },
        {"type": "object", "unevaluatedProperties": False},
        {"type": "array", "unevaluatedItems": {"type": "integer"}, "maxItems": 3},
        {"allOf": [{"enum": [1, 2, 3, "x"]}, {"enum": [2.0, 3, "y"]}]},
        {"enum": [1, 2], "const": 2},
    ],
)
def test_property_names_unevaluated_keywords_and_enums_of_several_members_hold(schema: Any) -> None:
    compiled = schema_of(schema)
    check_walks(schema, compiled, range(30))


def test_property_names_leave_out_the_declared_names_they_rule_out() -> None:
    schema = {
        "type": "object",
        "properties": {"ab": {"const": 1}, "Cd": {"const": 2}},
        "propertyNames": {"pattern": "^[a-z]+$"},
    }
    compiled = schema_of(schema)
    assert accepts(compiled, b'{"ab":1}') and not accepts(compiled, b'{"ab":1,"Cd":2}')
    refused({**schema, "required": ["Cd"]}, "CONSTRAINT_UNSATISFIABLE")
    refused({**schema, "propertyNames": {"minProperties": 1}}, "SCHEMA_UNSUPPORTED")


def test_enums_of_two_all_of_members_keep_the_values_in_both() -> None:
    compiled = schema_of({"allOf": [{"enum": [1, 2, 3]}, {"enum": [2, 3, 4]}]})
    assert [accepts(compiled, str(v).encode()) for v in (1, 2, 3, 4)] == [False, True, True, False]
    refused({"allOf": [{"enum": [1]}, {"enum": [2]}]}, "CONSTRAINT_UNSATISFIABLE")
    refused({"enum": [1, 2], "const": 3}, "CONSTRAINT_UNSATISFIABLE")


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {}}, "dependentRequired": {"b": ["a"]}},
        {"type": "object", "properties": {"a": {}}, "dependentSchemas": {"b": {"required": ["a"]}}},
        {"type": "object", "properties": {"a": {}}, "dependencies": {"b": ["a"]}},
        {"type": "object", "properties": {"a": {}}, "not": {"required": ["b"]}},
    ],
)
def test_a_name_a_dependency_or_not_rules_out_is_not_written_as_another_member(schema: Any) -> None:
    compiled = schema_of(schema)
    assert accepts(compiled, b'{"a":1,"c":2}') and accepts(compiled, b'{"c":2}')
    assert not accepts(compiled, b'{"b":1}') and not accepts(compiled, b'{"a":1,"b":1}')


def test_then_and_else_without_an_if_assert_nothing_and_a_boolean_if_picks_one() -> None:
    compiled = schema_of({"type": "string", "maxLength": 3, "then": {"const": "yes"}, "else": {"const": "n"}})
    assert accepts(compiled, b'"abc"') and accepts(compiled, b'"yes"')
    picked = schema_of({"if": False, "then": {"const": "a"}, "else": {"const": "b"}})
    assert accepts(picked, b'"b"') and not accepts(picked, b'"a"')
    picked = schema_of({"if": True, "then": {"const": "a"}, "else": {"const": "b"}})
    assert accepts(picked, b'"a"') and not accepts(picked, b'"b"')
    member = schema_of({"allOf": [{"type": "integer"}, {"then": {"const": 1}}]})
    assert accepts(member, b"2")


@pytest.mark.parametrize(
    "schema",
    [
        {
            "type": "object",
            "properties": {"x": {"type": "integer"}, "y": {}},
            "if": {"required": ["y"]},
            "then": {"required": ["x"]},
        },
        {
            "type": "object",
            "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
            "if": {"required": ["y"]},
            "then": {"required": ["x"]},
            "else": {"properties": {"x": {"minimum": 5}}},
        },
        {
            "type": ["integer", "string"],
            "if": {"type": "string"},
            "then": {"minLength": 2},
            "else": {"minimum": 3},
        },
        {
            "type": "array",
            "if": {"items": {"type": "string"}},
            "then": {"items": {"maxLength": 1}},
            "else": {"items": {"properties": {"x": {"type": "integer"}}}},
        },
    ],
)
def test_an_if_whose_negation_can_be_written_holds_exactly(schema: Any) -> None:
    compiled = schema_of(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for instance in [
        {},
        {"x": 1},
        {"x": 7},
        {"y": 2},
        {"x": 1, "y": 2},
        {"x": 7, "y": 2},
        1,
        4,
        "a",
        "ab",
        [],
        ["a"],
        ["ab"],
        ["a", {"x": 1}],
        [{"x": "s"}, "a"],
        ["ab", 3],
    ]:
        text = json.dumps(instance, separators=(",", ":")).encode()
        assert accepts(compiled, text) == validator.is_valid(instance), text


def test_then_holds_always_when_there_is_no_else_and_the_if_cannot_be_negated() -> None:
    compiled = schema_of(
        {
            "type": "object",
            "properties": {"x": {"type": "integer"}},
            "if": {"properties": {"y": {"minimum": 2}}},
            "then": {"required": ["x"]},
        }
    )
    assert accepts(compiled, b'{"x":1}') and not accepts(compiled, b"{}")


def test_numbers_are_json_numbers() -> None:
    compiled = schema_of({"type": "number"})
    for text in ["0", "-0", "12.5", "-0.5e+10", "3E7", "1e-2"]:
        assert accepts(compiled, text.encode()), text
    for text in ["01", "1.", ".5", "+1", "1e", "--1", "NaN", "Infinity", "0x1"]:
        assert not accepts(compiled, text.encode()), text


@pytest.mark.parametrize(
    ("schema", "written"),
    [
        ({"type": "number", "minimum": 0, "maximum": 1}, ["1e-06", "5e-1", "9.99e-1"]),
        ({"type": "number", "minimum": 0}, ["1e-06", "1e0", "1e+20", "1.5E3"]),
        ({"type": "number", "exclusiveMinimum": 0}, ["1e-06", "1e+20"]),
        ({"type": "number", "minimum": 0.5}, ["1e0", "1e+20"]),
        ({"type": "number", "maximum": 1}, ["1e-06"]),
        ({"type": "number", "exclusiveMinimum": 1}, []),
        ({"type": "number", "minimum": -3, "maximum": 2.5}, ["1e-06"]),
        ({"type": "number", "exclusiveMaximum": 1, "minimum": 0}, ["9.99e-1"]),
    ],
)
def test_a_bounded_number_admits_the_exponent_writings_its_bounds_hold_for_and_no_other(
    schema: Any, written: list[str]
) -> None:
    compiled = schema_of(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for text in ["1e-06", "5e-1", "9.99e-1", "1e0", "1e+20", "1.5E3", "-1e-06", "1e-0", "1e-00", "1e-99"]:
        assert not accepts(compiled, text.encode()) or validator.is_valid(json.loads(text)), text
    assert all(accepts(compiled, text.encode()) for text in written)


@pytest.mark.parametrize("most", [60, 100, 254])
def test_an_email_with_a_max_length_past_the_automaton_limit_writes_a_subset_within_it(most: int) -> None:
    from engine.constrain.formats import FORMATS

    compiled = schema_of({"type": "string", "format": "email", "maxLength": most})
    assert accepts(compiled, b'"john.doe@mail.example.com"') and accepts(compiled, b'"a@b.co"')
    assert not accepts(compiled, json.dumps("a" * (most - 5) + "@b.com").encode())  # one past
    for seed in range(6):
        text, _ = random_walk(compiled, seed)
        email = json.loads(text)
        assert len(email) <= most and re.fullmatch(FORMATS["email"], email), email


def test_a_column_sized_max_length_writes_strings_up_to_the_string_bound() -> None:
    from engine.constrain.json_scalars import MAX_STRING_BOUND

    columns = schema_of(
        {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                name: {"type": "string", "maxLength": 65535, "minLength": 2} for name in "abcdefgh"
            },
        }
    )
    longest = "x" * MAX_STRING_BOUND
    assert accepts(columns, json.dumps({"a": longest, "h": "yz"}, separators=(",", ":")).encode())
    assert not accepts(columns, json.dumps({"a": longest + "x"}, separators=(",", ":")).encode())
    assert not accepts(columns, b'{"a":"x"}')  # minLength still holds


def test_string_lengths_count_characters_and_escapes_count_once() -> None:
    compiled = schema_of({"type": "string", "minLength": 2, "maxLength": 2})
    for text in ['"ab"', '"é日"', '"\\n\\u00e9"', '"😀x"', '"\\"\\\\"']:
        assert accepts(compiled, text.encode()), text
    for text in ['"a"', '"abc"', '"\\ud83d\\ude00"', '"a\nb"', '"a\\x"']:
        assert not accepts(compiled, text.encode()), text


def test_a_pattern_matches_anywhere_unless_anchored() -> None:
    loose, anchored = schema_of({"pattern": "ab"}), schema_of({"pattern": "^ab$"})
    assert all(accepts(loose, t.encode()) for t in ['"ab"', '"xxabyy"', '"\\"ab"'])
    assert not accepts(loose, b'"a b"')
    assert accepts(anchored, b'"ab"') and not accepts(anchored, b'"xab"') and not accepts(anchored, b'"abx"')


@pytest.mark.parametrize(
    "pattern", ["^a|b$", '^[a"]+$', "^\\d+(\\.\\d+)?$", "$", "^", "a.b", '\\\\|"', "^(ab)*$"]
)
def test_a_string_pattern_admits_exactly_the_strings_python_re_search_finds_it_in(pattern: str) -> None:
    compiled = schema_of({"type": "string", "pattern": pattern})
    for length in range(4):
        for letters in itertools.product(["a", "b", '"', "\\", "1", ".", "\n"], repeat=length):
            word = "".join(letters)
            # ECMA's $ (JSON Schema's) ends the string; Python's also matches before a last newline.
            found = re.search(pattern.replace("$", "\\Z"), word, re.ASCII) is not None
            assert accepts(compiled, json.dumps(word).encode()) == found, word


def test_recursion_through_a_ref_alone_reaches_any_depth() -> None:
    node = {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}, "additionalProperties": False}
    compiled = schema_of({"$defs": {"n": node}, "$ref": "#/$defs/n"})
    nested = "{}"
    for _ in range(40):
        assert accepts(compiled, nested.encode()), nested
        nested = '{"c":' + nested + "}"
    assert not accepts(compiled, b'{"c":{"c":1}}') and not accepts(compiled, b'{"c":{"d":{}}}')


def test_a_ref_with_keywords_beside_it_is_entered_at_most_max_ref_depth_times_along_a_path() -> None:
    node = {"type": "object", "properties": {"c": {"$ref": "#/$defs/n", "minProperties": 0}}}
    schema = {"$defs": {"n": node}, "$ref": "#/$defs/n"}
    nested = ["{}", '{"c":{}}', '{"c":{"c":{}}}', '{"c":{"c":{"c":{}}}}']
    for depth in (1, 2, 3):
        compiled = compile_constraint("json_schema", json.dumps(schema), VOCAB, Limits(max_ref_depth=depth))
        assert [accepts(compiled, t.encode()) for t in nested] == [i <= depth for i in range(4)]


DISCRIMINATED = [
    {
        "type": "object",
        "required": ["kind"],
        "properties": {"kind": {"type": "string"}, "n": {"type": "integer"}, "m": {"type": "string"}},
        "allOf": [
            {"if": {"properties": {"kind": {"const": "a"}}}, "then": {"required": ["n"]}},
            {
                "if": {"properties": {"kind": {"const": "b"}}},
                "then": {"required": ["m"]},
                "else": {"properties": {"m": False}},
            },
        ],
    },
    {
        "type": "object",
        "properties": {"kind": {"enum": ["a", "b", "c"]}, "n": {"type": "integer"}},
        "if": {"properties": {"kind": {"enum": ["a", "b"]}}, "required": ["kind"]},
        "then": {"properties": {"n": {"minimum": 5}}},
        "else": {"properties": {"n": {"maximum": 0}}},
    },
    {
        "type": "object",
        "properties": {"on": {"type": "boolean"}, "m": {"type": "string"}},
        "if": {"properties": {"on": {"const": True}}},
        "then": {"required": ["m"]},
    },
    {
        "type": "object",
        "properties": {"kind": {"type": ["string", "null"]}, "n": {"type": "integer"}},
        "if": {"properties": {"kind": {"anyOf": [{"const": "a"}, {"type": "null"}]}}},
        "then": {"required": ["n"]},
        "else": {
            "if": {"properties": {"kind": {"const": "b"}}},
            "then": {"properties": {"n": {"maximum": 0}}},
            "else": {"properties": {"n": False}},
        },
    },
]


@pytest.mark.parametrize("schema", DISCRIMINATED)
def test_conditions_on_one_property_s_value_admit_exactly_what_the_schema_validates(schema: Any) -> None:
    compiled = schema_of(schema)
    names = list(schema["properties"])
    absent = object()
    choices = {
        "kind": [absent, "a", "b", "c", "ab", "", None],
        "on": [absent, True, False],
        "n": [absent, 1, 7, -3],
        "m": [absent, "x"],
    }
    for values in itertools.product(*(choices[name] for name in names)):
        instance = {name: value for name, value in zip(names, values, strict=True) if value is not absent}
        valid = jsonschema.Draft7Validator(schema).is_valid(instance)
        text = json.dumps(instance, separators=(",", ":")).encode()
        assert accepts(compiled, text) == valid, text


def test_items_of_two_all_of_members_hold_both() -> None:
    both = schema_of({"type": "array", "allOf": [{"items": {"type": "integer"}}, {"items": {"minimum": 2}}]})
    assert accepts(both, b"[2,3]") and not accepts(both, b"[1]") and not accepts(both, b'["x"]')
    # unevaluatedItems sees only its own member's items (none): every item is unevaluated there.
    alone = schema_of(
        {"type": "array", "allOf": [{"items": {"type": "string"}}, {"unevaluatedItems": False}]}
    )
    assert accepts(alone, b"[]") and not accepts(alone, b'["a"]')


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "multipleOf": 7},
        {"type": "integer", "multipleOf": 5, "minimum": 0, "maximum": 60},
        {"type": "integer", "multipleOf": 2.5},
        {"type": "number", "multipleOf": 1},
        {"type": "number", "multipleOf": 0.25, "exclusiveMinimum": -2},
        {"type": ["integer", "string"], "multipleOf": 3},
    ],
)
def test_multiple_of_admits_exactly_the_multiples(schema: Any) -> None:
    compiled = schema_of(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for text in [
        "0",
        "3",
        "-3",
        "7",
        "14",
        "-21",
        "10",
        "15",
        "55",
        "60",
        "65",
        "1.0",
        "2.5",
        "-2.5",
        "-1.75",
        "0.25",
        "7.5",
        "1.5",
        "0.1",
        "2.50",
        "2.51",
        "100000000000005",
        '"x"',
    ]:
        assert accepts(compiled, text.encode()) == validator.is_valid(json.loads(text)), (schema, text)


@pytest.mark.parametrize(
    "bounds",
    [
        {"minimum": 0.5},
        {"exclusiveMinimum": 0.05, "maximum": 100},
        {"exclusiveMaximum": -0.25},
        {"minimum": -1.5, "maximum": 2.25},
        {"exclusiveMinimum": -0.75, "exclusiveMaximum": 0},
        {"minimum": -3.1416, "exclusiveMaximum": -3},
        {"maximum": 0.1, "multipleOf": 0.05},
    ],
)
def test_decimal_bounds_on_a_number_admit_exactly_the_numbers_between_them(bounds: dict[str, float]) -> None:
    schema = {"type": "number", **bounds}
    compiled = schema_of(schema)
    validator = jsonschema.Draft202012Validator(schema)
    texts = """0 -0 1 -1 0.5 0.49 0.500 0.5001 0.05 0.0500 0.04999 100 100.0 100.01 -0.25 -0.2500 -0.2499
               -0.75 -0.7501 2.25 2.2500001 -1.5 -1.50 -3.1416 -3.14159 -3.14161 -3 -3.0 -2.99 0.1 0.10 0.15
               12345.678""".split()
    for text in texts:
        assert accepts(compiled, text.encode()) == validator.is_valid(json.loads(text)), (schema, text)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "not": {"pattern": "^a"}},
        {"type": ["string", "integer"], "maxLength": 3, "not": {"pattern": "b$"}},
        {"type": "integer", "not": {"enum": [1, 5]}},
        {"type": "number", "not": {"const": 1.5}},
        {"type": "string", "minLength": 2, "not": {"enum": ["ab", 'x"y']}},
        {"not": {"not": {"type": "integer", "minimum": 2}}},
        {"anyOf": [{"type": "integer", "not": {}}, {"type": "string", "maxLength": 1}]},
    ],
)
def test_not_of_patterns_values_and_not_admits_exactly_what_the_schema_validates(schema: Any) -> None:
    compiled = schema_of(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for text in [
        '"abc"',
        '"bac"',
        '""',
        '"ab"',
        '"b"',
        '"x\\"y"',
        '"\\u0061b"',
        '"ba"',
        "1",
        "2",
        "5",
        "-1",
        "1.5",
        "1.50",
        "1.55",
        "15",
        "null",
        "true",
    ]:
        assert accepts(compiled, text.encode()) <= validator.is_valid(json.loads(text)), (schema, text)
        if "\\u" not in text:  # an escape that spells a value ruled out is not written
            assert accepts(compiled, text.encode()) == validator.is_valid(json.loads(text)), (schema, text)


@pytest.mark.parametrize(
    "schema",
    [
        {"enum": ["a", "bbb", 3, 10, None], "maxLength": 2, "maximum": 5},
        {
            "enum": [{"a": 1}, {"a": "x"}, {"b": 2}],
            "properties": {"a": {"type": "integer"}},
            "required": ["a"],
        },
        {"type": "string", "enum": ["ab", "xyz"], "pattern": "^a"},
    ],
)
def test_enum_values_beside_other_keywords_are_those_the_keywords_admit(schema: Any) -> None:
    compiled = schema_of(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for value in schema["enum"]:
        written = json.dumps(value, separators=(",", ":")).encode()
        assert accepts(compiled, written) == validator.is_valid(value), value


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "array", "contains": {"type": "string"}},
        {"contains": {"const": 1}, "items": {"type": "integer"}, "minItems": 1},
        {"type": "array", "contains": {"minimum": 5}, "minContains": 0},
    ],
)
def test_contains_admits_exactly_the_arrays_with_a_matching_item(schema: Any) -> None:
    compiled = schema_of(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for text in ["[]", '["a"]', '[1,"a",2]', "[1,2]", "[1]", "[2,1,3]", "[7]", '"x"']:
        assert accepts(compiled, text.encode()) == validator.is_valid(json.loads(text)), (schema, text)


def test_multiple_of_a_decimal_step_bounds_the_fraction_digits() -> None:
    cents = schema_of({"type": "number", "multipleOf": 0.01, "minimum": 0})
    for text in ["0", "12", "12.3", "12.34", "0.05", "12.340"]:
        assert accepts(cents, text.encode()), text
    for text in ["12.345", "-1", "1e2", "0.001"]:
        assert not accepts(cents, text.encode()), text


@pytest.mark.parametrize(
    ("schema", "draft"),
    [
        (
            {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": False},
            jsonschema.Draft202012Validator,
        ),
        (
            {"prefixItems": [{"const": 1}], "items": {"type": "boolean"}, "minItems": 2, "maxItems": 3},
            jsonschema.Draft202012Validator,
        ),
        ({"type": "array", "items": [{"type": "integer"}, {"type": "string"}]}, jsonschema.Draft7Validator),
        (
            {"items": [{"const": 1}, {"type": "string"}], "additionalItems": {"type": "null"}, "maxItems": 1},
            jsonschema.Draft7Validator,
        ),
        ({"items": [{"const": 1}], "additionalItems": False, "minItems": 2}, jsonschema.Draft7Validator),
    ],
)
def test_items_by_position_admit_exactly_the_arrays_the_schema_validates(schema: Any, draft: Any) -> None:
    compiled = schema_of(schema)
    pool: list[Any] = [1, 2, "a", True, None]
    for length in range(5):
        for instance in itertools.product(pool, repeat=length):
            text = json.dumps(list(instance), separators=(",", ":")).encode()
            assert accepts(compiled, text) == draft(schema).is_valid(list(instance)), text


@pytest.mark.parametrize(
    "schema",
    [
        {
            "type": "object",
            "additionalProperties": False,
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
            "not": {"anyOf": [{"required": ["a", "b"]}, {"required": ["c"]}]},
        },
        {
            "type": "object",
            "allOf": [
                {"properties": {"a": {"type": "integer"}}},
                {"properties": {"b": {"type": "integer"}}},
                {"not": {"anyOf": [{"required": ["a", "b"]}]}},
            ],
        },
    ],
)
def test_not_of_required_lists_admits_exactly_what_the_schema_validates(schema: Any) -> None:
    check_combinations(schema)


@pytest.mark.parametrize(
    "schema",
    [
        {
            "type": "object",
            "dependencies": {"a": ["b"], "c": {"required": ["a"]}},
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
        },
        {
            "type": "object",
            "additionalProperties": False,
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
            "dependentRequired": {"a": ["b"]},
            "dependentSchemas": {"b": {"properties": {"c": {"minimum": 3}}}},
        },
    ],
)
def test_dependencies_of_optional_properties_admit_exactly_what_the_schema_validates(schema: Any) -> None:
    check_combinations(schema)


THREE = {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}}


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": THREE, "dependencies": {"a": ["b"], "b": ["c"]}},
        {"type": "object", "properties": THREE, "dependencies": {"c": ["a"], "a": {"required": ["b"]}}},
    ],
)
def test_chained_dependencies_admit_exactly_what_the_schema_validates(schema: Any) -> None:
    check_combinations(schema)


@pytest.mark.parametrize(
    "schema",
    [
        {
            "type": "object",
            "properties": THREE,
            "allOf": [
                {"if": {"not": {"properties": {"a": {"const": 5}}}}, "then": {"required": ["c"]}},
                {"if": {"properties": {"c": {"const": 1}}, "required": ["c"]}, "then": {"required": ["b"]}},
            ],
        },
        {
            "$defs": {
                "auth": {
                    "allOf": [
                        {
                            "if": {"not": {"properties": {"a": {"const": 1}}}},
                            "then": {"properties": {"b": {"const": 5}}},
                        },
                        {
                            "if": {"not": {"properties": {"b": {"const": 2}}}},
                            "then": {"properties": {"a": {"const": 5}}},
                        },
                    ]
                }
            },
            "type": "object",
            "properties": THREE,
            "allOf": [{"$ref": "#/$defs/auth"}],
            "additionalProperties": False,
        },
    ],
)
def test_if_then_else_in_all_of_members_admits_exactly_what_the_schema_validates(schema: Any) -> None:
    check_combinations(schema)


def test_properties_of_an_all_of_member_and_beside_it_come_in_any_order() -> None:
    member = {"properties": {"b": {"type": "integer"}}, "required": ["b"]}
    for schema in (
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "allOf": [member]},
        {"allOf": [member], "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    ):
        compiled = schema_of(schema)
        assert accepts(compiled, b'{"a":1,"b":2}') and accepts(compiled, b'{"b":2,"a":1}')
        assert not accepts(compiled, b'{"b":2}') and not accepts(compiled, b'{"a":1,"b":2,"a":1}')


# TextMate grammars' pattern object: more dependencies than MAX_DEPENDENT_CHOICES, lists naming
# names that have dependent schemas.
TEXTMATE_DEPENDENCIES = {
    "begin": {"anyOf": [{"required": ["end"]}, {"required": ["while"]}]},
    "end": ["begin"],
    "while": ["begin"],
    "contentName": {"anyOf": [{"required": ["begin", "end"]}, {"required": ["begin", "while"]}]},
    "beginCaptures": {"required": ["begin"]},
    "whileCaptures": ["begin", "while"],
    "endCaptures": ["begin", "end"],
    "applyEndPatternLast": ["end"],
}


def test_dependencies_of_names_on_names_hold_exactly_however_many_there_are() -> None:
    """TextMate's pattern object: eight dependencies (lists, `required`, anyOf of `required`),
    more choices than alternatives could write: the members keep the set written instead."""
    names = ["match", "name", *TEXTMATE_DEPENDENCIES]
    schema = {
        "type": "object",
        "properties": {n: {"type": "string"} for n in names},
        "dependencies": TEXTMATE_DEPENDENCIES,
        "additionalProperties": False,
    }
    compiled, validator = schema_of(schema), jsonschema.Draft7Validator(schema)
    for size in range(len(names) + 1):
        for chosen in itertools.combinations(names, size):
            instance = dict.fromkeys(reversed(chosen), "x")
            text = json.dumps(instance, separators=(",", ":")).encode()
            assert accepts(compiled, text) == validator.is_valid(instance), text
    check_walks(schema, compiled, range(6))


def test_twenty_list_dependencies_hold_exactly_in_any_order() -> None:
    names = [f"n{i}" for i in range(20)]
    schema = {
        "type": "object",
        "properties": {n: {"type": "integer"} for n in names},
        "dependentRequired": {names[i]: [names[(i * 7 + 3) % 20]] for i in range(0, 20, 2)},
        "additionalProperties": False,
    }
    compiled, validator = schema_of(schema), jsonschema.Draft202012Validator(schema)
    rng = np.random.default_rng(3)
    for _ in range(300):
        chosen = [str(n) for n in rng.permutation(names)[: int(rng.integers(0, 21))]]
        instance = dict.fromkeys(chosen, 1)
        text = json.dumps(instance, separators=(",", ":")).encode()
        assert accepts(compiled, text) == validator.is_valid(instance), text


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": THREE, "oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
        {
            "type": "object",
            "properties": THREE,
            "additionalProperties": False,
            "required": ["c"],
            "oneOf": [{"required": ["a"]}, {"required": ["b"]}],
        },
        {
            "$defs": {"x": {"type": "object", "required": ["a", "c"]}},
            "type": "object",
            "properties": THREE,
            "oneOf": [{"$ref": "#/$defs/x"}, {"required": ["b"]}],
        },
        {
            "type": "object",
            "oneOf": [
                {
                    "properties": THREE,
                    "additionalProperties": False,
                    "anyOf": [{"required": ["a", "b"]}, {"required": ["a", "c"]}],
                },
                {"properties": {"a": THREE["a"]}, "required": ["a"], "additionalProperties": False},
            ],
        },
        {
            "type": "object",
            "oneOf": [
                {"required": ["c"], "properties": THREE},
                {"properties": {"a": THREE["a"], "b": THREE["b"]}, "additionalProperties": False},
            ],
        },
        # A member requiring a name with a value there: its `not` is the name left out or another
        # value (Schema Store's Stream Deck actions: an icon, or hidden from the list).
        {
            "type": "object",
            "properties": THREE,
            "required": ["a"],
            "oneOf": [{"required": ["b"]}, {"required": ["c"], "properties": {"c": {"const": 3}}}],
        },
        # A member that holds wherever another does (its names required anyway): never alone.
        {
            "type": "object",
            "properties": THREE,
            "required": ["a"],
            "oneOf": [{"required": ["a"]}, {"required": ["b"]}],
        },
        {
            "type": "object",
            "properties": THREE,
            "additionalProperties": False,
            "if": {"anyOf": [{"required": ["a"]}, {"required": ["b"]}]},
            "then": {"oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
            "else": {"oneOf": [{"required": ["a"]}, {"required": ["b"]}, {"required": ["c"]}]},
        },
    ],
)
def test_one_of_members_that_require_names_are_kept_apart_exactly(schema: Any) -> None:
    check_combinations(schema)


def test_an_if_that_an_array_contains_an_item_admits_exactly_what_the_schema_validates() -> None:
    """`not` of `contains` (no item meets it), through an `if` that is a $ref (libman's manifest:
    version 3.0 once a library maps files)."""
    schema = {
        "type": "object",
        "properties": {
            "libs": {"type": "array", "items": {"type": "object", "properties": THREE}},
            "v": {"enum": [1, 3]},
        },
        "definitions": {"mapped": {"properties": {"libs": {"contains": {"required": ["c"]}}}}},
        "if": {"$ref": "#/definitions/mapped"},
        "then": {"properties": {"v": {"const": 3}}, "required": ["v"]},
    }
    compiled = schema_of(schema)
    items = [{"a": 1}, {"c": 3}]
    for libs in [None, [], *([i] for i in items), *itertools.product(items, repeat=2)]:
        for v in (None, 1, 3):
            instance = {
                k: x
                for k, x in (("libs", list(libs) if libs is not None else None), ("v", v))
                if x is not None
            }
            text = json.dumps(instance, separators=(",", ":")).encode()
            assert accepts(compiled, text) == jsonschema.Draft7Validator(schema).is_valid(instance), text


def test_dates_and_times_are_real_ones_with_leap_days_and_up_to_nanoseconds() -> None:
    date, moment = schema_of({"type": "string", "format": "date"}), schema_of({"format": "date-time"})
    for day in ["2024-02-29", "2000-02-29", "1600-02-29", "2023-02-28"]:
        assert accepts(date, f'"{day}"'.encode()), day
    for day in ["2023-02-29", "1900-02-29", "2100-02-29", "2024-02-30"]:
        assert not accepts(date, f'"{day}"'.encode()), day
    for text in ["2021-06-15T09:16:47.765072012+02:00", "2021-06-15T09:16:47.7Z", "2024-02-29T00:00:00Z"]:
        assert accepts(moment, f'"{text}"'.encode()), text
    for text in ["2021-06-15T09:16:47.7650720123Z", "2021-06-15T09:16:47", "2021-06-15T09:16:47.Z"]:
        assert not accepts(moment, f'"{text}"'.encode()), text


def test_one_of_members_whose_required_values_cannot_meet_are_written_whole() -> None:
    status = {
        "type": "object",
        "oneOf": [
            {"required": ["status", "data"], "properties": {"status": {"pattern": "^success$"}, "data": {}}},
            {"required": ["status", "data"], "properties": {"status": {"pattern": "^fail$"}, "data": {}}},
        ],
    }
    compiled = schema_of(status)
    for text in ['{"status":"success","data":1}', '{"status":"fail","data":null}']:
        assert accepts(compiled, text.encode()), text
    assert not accepts(compiled, b'{"status":"other","data":1}')
    tagged = schema_of(
        {
            "type": "object",
            "required": ["type"],
            "properties": {"type": {"type": "string"}},
            "oneOf": [
                {"properties": {"type": {"enum": ["Point"]}, "x": {}}, "required": ["x"]},
                {"properties": {"type": {"enum": ["Line"]}, "y": {}}, "required": ["y"]},
            ],
        }
    )
    assert accepts(tagged, b'{"type":"Point","x":1}') and not accepts(tagged, b'{"type":"Line","x":1}')


def test_properties_beside_an_any_of_and_a_member_s_come_in_any_order() -> None:
    compiled = schema_of(
        {
            "type": "object",
            "additionalProperties": False,
            "properties": {"a": {"type": "string"}, "b": {}, "c": {}},
            "anyOf": [{"properties": {"c": {"const": 1}, "a": {"const": "x"}}}],
        }
    )
    assert accepts(compiled, b'{"a":"x","b":2,"c":1}') and accepts(compiled, b'{"c":1,"a":"x","b":2}')
    assert not accepts(compiled, b'{"c":2,"a":"x","b":2}') and not accepts(compiled, b'{"c":1,"a":"y"}')


def test_one_of_members_apart_by_type_values_or_a_discriminator_need_nothing_more() -> None:
    assert disjoint({"type": "string"}, {"type": ["object", "null"]})
    assert not disjoint({"type": "integer"}, {"type": "number"})
    assert disjoint({"enum": ["a", 1]}, {"const": "b"}) and not disjoint({"enum": [1]}, {"const": 1.0})
    tagged = [{"properties": {"kind": {"const": k}}, "required": ["kind"]} for k in ("a", "b")]
    assert disjoint(*tagged)
    assert not disjoint({"properties": {"kind": {"const": "a"}}}, {"properties": {"kind": {"const": "b"}}})
    one, more = {"type": "array", "minItems": 1, "maxItems": 1}, {"type": "array", "minItems": 2}
    assert disjoint(one, more) and disjoint(one, {"minItems": 2})
    assert not disjoint({"maxItems": 1}, {"minItems": 2})  # a string meets both
    assert disjoint({"type": "string", "maxLength": 3}, {"minLength": 4, "type": "string"})


@pytest.mark.parametrize(
    ("schema", "instances"),
    [
        (
            {"oneOf": [{"type": "integer"}, {"minimum": 2}]},
            [1, 2, 3, 25, -4, 2.5, 1.5, "x", {"a": 1}, [1], None],
        ),
        ({"type": "string", "oneOf": [{"minLength": 2}, {"maxLength": 4}]}, ["", "a", "ab", "abcd", "abcde"]),
        ({"oneOf": [{"type": "number"}, {}]}, [123, 1.5, "foo", None, True, [], {}]),
        (
            {"oneOf": [{"type": "integer", "maximum": 10}, {"type": "integer", "minimum": 5}]},
            [-3, 4, 5, 10, 11, 99],
        ),
        (
            {"oneOf": [{"pattern": "^a"}, {"pattern": "b$"}, {"type": "integer"}]},
            ["a", "b", "ab", "ba", "c", 7],
        ),
    ],
)
def test_one_of_members_that_overlap_as_automata_admit_exactly_one_member_s_values(
    schema: Any, instances: list[Any]
) -> None:
    compiled = schema_of(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for instance in instances:
        text = json.dumps(instance, separators=(",", ":")).encode()
        assert accepts(compiled, text) == validator.is_valid(instance), text


def test_a_one_of_member_written_twice_admits_nothing_either_meets() -> None:
    with pytest.raises(InvalidInput) as caught:
        schema_of({"oneOf": [True, {}, {"type": "string"}]})
    assert caught.value.reason == "CONSTRAINT_UNSATISFIABLE"
    twice = schema_of({"oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "string"}]})
    assert accepts(twice, b"3") and not accepts(twice, b'"x"')


def test_first_bytes_are_what_a_match_may_start_with() -> None:
    from engine.constrain import machines as mx
    from engine.constrain.pattern import EMPTY, Ref, alt, chars, members, repeat, seq, text

    assert mx.first_bytes(seq(text("{"), Ref("x"))) == {ord("{")}
    assert mx.first_bytes(alt(text("true"), chars(((0x30, 0x39),)))) == {ord("t"), *range(0x30, 0x3A)}
    assert mx.first_bytes(seq(repeat(text("a"), 0, None), text("b"))) == {ord("a"), ord("b")}
    assert mx.first_bytes(repeat(text("a"), 0, None)) is None  # may be empty
    assert mx.first_bytes(Ref("x")) is None and mx.first_bytes(EMPTY) is None
    assert 0xC3 in (mx.first_bytes(chars(((0xE9, 0xE9),))) or set())
    assert mx.first_bytes(members([(text("a"), False), (text("b"), True), (text("c"), True)], text(","))) == {
        ord("a"),
        ord("b"),
    }


def test_one_of_members_that_differ_one_level_down_are_kept_apart_there() -> None:
    image = {
        "properties": {"content": {"properties": {"alt": {}, "src": {}}, "required": ["src", "alt"]}},
        "required": ["content"],
        "type": "object",
    }
    picture = {
        "properties": {"content": {"properties": {"bg": {"type": "object"}}, "required": ["bg"]}},
        "required": ["content"],
        "type": "object",
    }
    schema = {
        "$defs": {"image": image, "picture": picture},
        "type": "object",
        "oneOf": [{"$ref": "#/$defs/picture"}, {"$ref": "#/$defs/image"}],
    }
    compiled = schema_of(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for instance in [
        {"content": {"bg": {}}},
        {"content": {"alt": "a", "src": "s"}},  # (in written order)
        {"content": {"bg": {}, "src": "s", "alt": "a"}},
        {"content": {"bg": {}, "alt": "a"}},
    ]:
        text = json.dumps(instance, separators=(",", ":")).encode()
        assert accepts(compiled, text) == validator.is_valid(instance), instance


def test_one_of_members_apart_by_item_counts_are_written_whole() -> None:
    contact = {"type": "object", "properties": {"email": {"type": "string"}}, "required": ["email"]}
    email = {
        "type": "object",
        "oneOf": [
            {
                "properties": {
                    "from": {"type": "array", "items": contact, "minItems": 1, "maxItems": 1},
                    "sender": {"oneOf": [{"type": "null"}, contact]},
                },
                "required": ["from"],
            },
            {
                "properties": {"from": {"type": "array", "items": contact, "minItems": 2}, "sender": contact},
                "required": ["from", "sender"],
            },
        ],
    }
    compiled = schema_of(email)
    validator = jsonschema.Draft202012Validator(email)
    for instance in [
        {"from": [{"email": "a"}], "sender": None},
        {"from": [{"email": "a"}]},
        {"from": [{"email": "a"}, {"email": "b"}], "sender": {"email": "c"}},
        {"from": [{"email": "a"}, {"email": "b"}], "sender": None},
        {"from": []},
    ]:
        text = json.dumps(instance, separators=(",", ":")).encode()
        assert accepts(compiled, text) == validator.is_valid(instance), text


def check_combinations(schema: Any) -> None:
    compiled = schema_of(schema)
    for values in itertools.product([None, 1], [None, 2], [None, 3, 1]):
        instance = {name: value for name, value in zip("abc", values, strict=True) if value is not None}
        text = json.dumps(instance, separators=(",", ":")).encode()
        draft = jsonschema.Draft7Validator if "dependencies" in schema else jsonschema.Draft202012Validator
        assert accepts(compiled, text) == draft(schema).is_valid(instance), text


def test_an_open_value_nests_containers_at_any_depth() -> None:
    compiled = schema_of({})
    for text in [
        '"x"',
        '[{"a": 1}]',
        '{"a": [1, 2], "b": null}',
        "[[]]",
        "[" * 40 + "1" + "]" * 40,
        '{"a":{"b":{"c":{"d":{"e":[{}]}}}}}',
    ]:
        assert accepts(compiled, text.encode()), text
    for text in ["[[1]", '{"a":}', "[1,]", "{1:2}"]:
        assert not accepts(compiled, text.encode()), text


def test_recursion_that_may_end_admits_every_depth_and_one_that_cannot_is_unsatisfiable() -> None:
    wrapped = {"type": "array", "items": {"$ref": "#/$defs/l"}, "minItems": 1, "maxItems": 1}
    compiled = schema_of({"$defs": {"l": {"anyOf": [{"type": "null"}, wrapped]}}, "$ref": "#/$defs/l"})
    assert accepts(compiled, b"[[null]]") and accepts(compiled, b"[" * 30 + b"null" + b"]" * 30)
    assert not accepts(compiled, b"[[]]") and not accepts(compiled, b"[null,null]")
    endless = {"type": "array", "items": {"$ref": "#/$defs/l"}, "minItems": 1}
    refused({"$defs": {"l": endless}, "$ref": "#/$defs/l"}, "CONSTRAINT_UNSATISFIABLE")


def test_a_ref_that_leads_back_to_itself_before_any_output_is_unsupported() -> None:
    looped = {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}
    refused({"$defs": {"a": looped}, "$ref": "#/$defs/a"}, "SCHEMA_UNSUPPORTED")


def test_a_schema_nested_past_the_limit_is_constraint_too_large() -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(70):
        schema = {"type": "array", "items": schema}
    refused(schema, "CONSTRAINT_TOO_LARGE")
    refused(
        corpus("ten properties"),
        "CONSTRAINT_TOO_LARGE",
        Limits(max_schema_dfa_states=100, max_schema_elements=100),
    )


def test_a_schema_that_admits_nothing_is_unsatisfiable() -> None:
    refused({"type": "string", "enum": [1, 2]}, "CONSTRAINT_UNSATISFIABLE")
    refused(False, "CONSTRAINT_UNSATISFIABLE")
    refused({"type": "object", "required": ["a"], "additionalProperties": False}, "CONSTRAINT_UNSATISFIABLE")


def test_a_required_name_missing_from_properties_takes_additional_properties() -> None:
    compiled = schema_of(
        {
            "properties": {"a": {"type": "null"}},
            "required": ["b"],
            "additionalProperties": {"type": "boolean"},
        }
    )
    assert accepts(compiled, b'{"a":null,"b":true}') and accepts(compiled, b'{"b":false}')
    assert not accepts(compiled, b'{"b":1}') and not accepts(compiled, b'{"a":null}')


# The default model's vocabulary (49,152 tokens, byte-level BPE).


@pytest.fixture(scope="module")
def smollm(default_model: Callable[[str], Path]) -> tuple[Tokenizer, Vocabulary]:
    tokenizer = Tokenizer(default_model("int4"))
    return tokenizer, Vocabulary.from_tokenizer(tokenizer, 49152, [tokenizer.eos_token_id or 2])


def test_walks_on_the_default_vocabulary_decode_to_json_that_validates(
    smollm: tuple[Tokenizer, Vocabulary],
) -> None:
    tokenizer, vocabulary = smollm
    schema = corpus("ten properties")
    compiled = compile_constraint("json_schema", json.dumps(schema), vocabulary)
    validator = jsonschema.Draft202012Validator(schema, format_checker=FORMATS)
    for seed in range(3):
        out, taken = random_walk(compiled, seed, greed=0.7)
        assert tokenizer.decode(taken) == out.decode("utf-8")
        validator.validate(json.loads(out))


def test_multibyte_choices_complete_on_the_default_vocabulary(smollm: tuple[Tokenizer, Vocabulary]) -> None:
    _, vocabulary = smollm
    compiled = compile_constraint("choice", ["café", "日本", "naïve ☃"], vocabulary)
    outputs = {random_walk(compiled, seed, greed=0.0)[0].decode("utf-8") for seed in range(30)}
    assert outputs == {"café", "日本", "naïve ☃"}
    row = compiled.start()
    assert not row.allowed()[list(vocabulary.eos_ids)].any() and row.allowed().sum() > 3


def test_the_first_mask_of_a_schema_allows_only_tokens_that_open_an_object(
    smollm: tuple[Tokenizer, Vocabulary],
) -> None:
    _, vocabulary = smollm
    allowed = compile_constraint("json_schema", '{"type": "object"}', vocabulary).start().allowed()
    pieces = [vocabulary.pieces[t] for t in np.flatnonzero(allowed)]
    assert pieces and all(p is not None and p.startswith(b"{") for p in pieces)
    assert b"{}" in pieces or b"{" in pieces


def test_an_integer_without_a_bound_has_at_most_twenty_digits() -> None:
    compiled = schema_of({"type": "integer"})
    assert accepts(compiled, b"18446744073709551615") and accepts(compiled, b"-99999999999999999999")
    assert not accepts(compiled, b"1" + b"0" * 20) and not accepts(compiled, b"-1" + b"0" * 20)
    above = schema_of({"type": "integer", "minimum": 5})  # a bound's open side: a double's exact integers
    assert accepts(above, b"999999999999999") and not accepts(above, b"1000000000000000")


def test_a_double_as_json_dumps_writes_it_fits_a_number() -> None:
    compiled = schema_of({"type": "number"})
    for value in (1.5707963267948966, 0.30000000000000004, 0.00012345678901234567, -1.2345678901234567e-05):
        assert accepts(compiled, json.dumps(value).encode()), value
    assert not accepts(compiled, b"0." + b"1" * 21)


def test_an_integer_bound_of_more_than_twenty_digits_is_kept() -> None:
    compiled = schema_of({"type": "integer", "minimum": 0, "maximum": 10**25})
    assert accepts(compiled, str(10**25).encode()) and not accepts(compiled, str(10**25 + 1).encode())
    below = schema_of({"type": "integer", "maximum": -(10**23)})
    assert accepts(below, str(-(10**24) + 1).encode()) and not accepts(below, str(-(10**24)).encode())


def test_a_number_has_at_most_twenty_integer_twenty_fraction_and_three_exponent_digits() -> None:
    compiled = schema_of({"type": "number"})
    for written in ["9" * 20, "-" + "9" * 20 + "." + "9" * 20, "1e308", "1.5E-324"]:
        assert accepts(compiled, written.encode()), written
    for written in ["9" * 21, "0." + "9" * 21, "1e1000"]:
        assert not accepts(compiled, written.encode()), written
    open_value = schema_of({})
    assert accepts(open_value, b"[" + b"9" * 20 + b"]") and not accepts(open_value, b"[" + b"9" * 21 + b"]")


def string_lengths(compiled: Any) -> tuple[int, int | None]:
    """The shortest and longest string (quotes left out) a compiled string schema allows, in
    bytes, from its DFA: None when some cycle can be repeated."""
    table, accepting = compiled.dfa.table, compiled.dfa.accepting
    lengths: dict[int, tuple[int, int | None]] = {}

    def walk(state: int, path: frozenset[int]) -> tuple[int, int | None]:
        if state not in lengths:
            ends = [(0, 0)] if accepting[state] else []
            for nxt in set(table[state].tolist()) - {0}:
                if nxt in path:
                    ends.append((10**9, None))
                    continue
                low, high = walk(nxt, path | {nxt})
                ends.append((low + 1, None if high is None else high + 1))
            lengths[state] = (
                min(e[0] for e in ends),
                None if any(e[1] is None for e in ends) else max(e[1] for e in ends if e[1] is not None),
            )
        return lengths[state]

    low, high = walk(1, frozenset({1}))
    return low - 2, None if high is None else high - 2


def test_the_format_lengths_are_each_formats_shortest_and_longest_strings() -> None:
    from engine.constrain.formats import FORMAT_LENGTHS

    for name, lengths in FORMAT_LENGTHS.items():
        assert string_lengths(schema_of({"type": "string", "format": name})) == lengths, name


UUID = f'"{"0" * 8}-{"a" * 4}-{"B" * 4}-{"1" * 4}-{"2" * 12}"'


@pytest.mark.parametrize(
    ("name", "bounds", "written"),
    [
        ("date", {"minLength": 10, "maxLength": 10}, '"2024-02-28"'),
        ("date", {"minLength": 1}, '"2024-02-28"'),
        ("uuid", {"maxLength": 36}, UUID),
        ("ipv4", {"minLength": 7, "maxLength": 15}, '"10.0.0.1"'),
    ],
)
def test_length_bounds_every_string_of_a_format_meets_keep_the_format(
    name: str, bounds: dict[str, int], written: str
) -> None:
    compiled = schema_of({"type": "string", "format": name, **bounds})
    assert accepts(compiled, written.encode()) and not accepts(compiled, b'"2024-02-30"')


def test_length_bounds_no_string_of_a_format_meets_leave_nothing_of_that_branch() -> None:
    refused({"type": "string", "format": "date", "maxLength": 8}, "CONSTRAINT_UNSATISFIABLE")
    either = schema_of({"anyOf": [{"type": "string", "format": "ipv4", "minLength": 16}, {"type": "null"}]})
    assert accepts(either, b"null") and not accepts(either, b'"1.2.3.4"')


@pytest.mark.parametrize(
    ("name", "bounds", "texts"),
    [
        ("email", {"maxLength": 8}, ["a@b.cd", "ab@cd.ef", "abcd@ef.gh", "a@bcdefgh.ij"]),
        ("ipv4", {"minLength": 8}, ["1.2.3.4", "10.2.3.4", "255.255.255.255"]),
        (
            "date-time",
            {"minLength": 22, "maxLength": 24},
            [
                "2024-01-02T03:04:05Z",
                "2024-01-02T03:04:05.5Z",
                "2024-01-02T03:04:05.123Z",
                "2024-01-02T03:04:05.1234Z",
            ],
        ),
    ],
)
def test_length_bounds_that_cut_a_format_admit_exactly_its_strings_of_those_lengths(
    name: str, bounds: dict[str, int], texts: list[str]
) -> None:
    schema = {"type": "string", "format": name, **bounds}
    compiled = schema_of(schema)
    validator = jsonschema.Draft202012Validator(schema, format_checker=FORMATS)
    for value in texts:
        assert accepts(compiled, json.dumps(value).encode()) == validator.is_valid(value), value


def test_a_length_that_cuts_a_format_past_the_automaton_limit_is_refused_naming_both_keywords() -> None:
    error = refused(
        {"type": "object", "properties": {"a/b": {"type": "string", "format": "uri", "maxLength": 30_000}}},
        "SCHEMA_UNSUPPORTED",
    )
    expected = "/properties/a~1b/maxLength: 'maxLength' beside 'format' 'uri'"
    assert str(error).startswith(expected), str(error)


def test_every_keyword_that_constrains_an_instance_is_enforced_or_refused_naming_its_pointer() -> None:
    from engine.constrain.json_keywords import ASSERTIONS, KNOWN, LOWERED

    for keyword in sorted(ASSERTIONS - KNOWN - LOWERED):  # LOWERED: written as the others (above)
        error = refused({"type": "object", "properties": {"a": {keyword: {}}}}, "SCHEMA_UNSUPPORTED")
        assert str(error).startswith(f"/properties/a/{keyword}: "), keyword


def test_keywords_that_constrain_nothing_are_ignored() -> None:
    """Annotations of any draft, OpenAPI's and Kubernetes' vendor keywords, and unknown ones: the
    schema compiles to what it compiles to without them."""
    plain = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "port": {"type": "integer", "minimum": 1}},
        "required": ["name"],
    }
    noted = {
        "id": "http://example.com/s",
        "name": "service",
        "links": [{"rel": "self"}],
        "example": {},
        "x-kubernetes-preserve-unknown-fields": True,
        "readonly": True,
        "self": {"ref": "x"},
        "type": "object",
        "$comment": "c",
        "nullable": False,
        "properties": {
            "name": {"type": "string", "maxLength": 8, "x-order": 1, "example": "web"},
            "port": {
                "type": "integer",
                "minimum": 1,
                "x-kubernetes-int-or-string": True,
                "deprecated": True,
                "examples": [80],
            },
        },
        "required": ["name"],
    }
    texts = [
        b'{"name": "web", "port": 80}',
        b'{"name":"web"}',
        b'{"name": "toolongname"}',
        b'{"port": 80}',
        b'{"name": "web", "port": 0}',
        b'{"name": "web", "other": 1}',
    ]
    expected = [accepts(schema_of(plain), t) for t in texts]
    assert expected == [True, True, False, False, False, True]  # others: the spec's reading
    assert [accepts(schema_of(noted), t) for t in texts] == expected


@pytest.mark.parametrize(
    ("name", "good", "bad"),
    [
        (
            "hostname",
            ['"example.com"', '"a"', '"my-host.internal"', f'"{"a" * 63}.com"', '"a-b--c.d"'],
            ['"-bad.com"', '"a..b"', '"a b"', f'"{"a" * 64}.com"', '"xn--X"', '"ab--c.com"'],
        ),
        (
            "uri",
            ['"https://example.com/a?b=1#c"', '"urn:isbn:0451450523"', '"mailto:a@b.c"', '"a:%20"'],
            ['"no scheme"', '"/relative"', '"http://a b"', '"a:%zz"'],
        ),
        (
            "uri-reference",
            ['"/relative/path?x=1"', '"https://example.com"', '""', '"#frag"'],
            ['"a b"', '"%g0"'],
        ),
    ],
)
def test_hostname_and_uri_formats_are_enforced(name: str, good: list[str], bad: list[str]) -> None:
    compiled = schema_of({"type": "string", "format": name})
    assert all(accepts(compiled, text.encode()) for text in good)
    assert not any(accepts(compiled, text.encode()) for text in bad)


def test_formats_that_are_not_enforced_are_annotations_any_string_within_the_lengths() -> None:
    compiled = schema_of({"type": "string", "format": "json-pointer", "maxLength": 5})
    assert accepts(compiled, b'"/a/b"') and accepts(compiled, b'"hello"')
    assert not accepts(compiled, b'"toolong"')
    beside = schema_of({"type": "string", "format": "json-pointer", "pattern": "^P"})
    assert accepts(beside, b'"P1D"') and not accepts(beside, b'"1D"')


@pytest.mark.parametrize(
    ("name", "good", "bad"),
    [
        (
            "ipv6",
            ["::1", "::", "2001:db8::8a2e:370:7334", "::ffff:192.168.1.1"],
            ["1::2::3", ":::", "12345::"],
        ),
        (
            "uri",
            ["http://example.com", "urn:isbn:0451450523", "http://[::1]:80/x?q#f"],
            ["://", "http://example.com:abc/path", "http://[::ffff:01.2.3.4]"],
        ),
        ("uri-reference", ["/a/b", "a/b", "", "?x", "#f", "//host/p"], ["://", ":a", "a b"]),
        ("iri", ["http://ex.com/\u015d", "http://\u4f8b\u5b50.\u6d4b\u8bd5"], ["not-an-iri", "://"]),
        (
            "uri-template",
            ["http://example.com/r/{id}", "/{+path}/x{?q,lang}", "{var:30}", "a{list*}"],
            ["http://example.com/r/{", "{}", "{a b}"],
        ),
        ("duration", ["P1D", "PT1H30M", "P1Y2M3DT4H5M6S", "P4W"], ["P", "PT", "P1D2Y", "1D"]),
    ],
)
def test_uris_templates_ipv6_and_durations_admit_their_rfc_grammar(
    name: str, good: list[str], bad: list[str]
) -> None:
    compiled = schema_of({"type": "string", "format": name})
    for value in good:
        assert accepts(compiled, json.dumps(json.loads(f'"{value}"'), ensure_ascii=False).encode()), value
    for value in bad:
        assert not accepts(compiled, json.dumps(value).encode()), value


def test_enum_and_const_objects_and_arrays_take_the_whitespace_any_value_may_have() -> None:
    compiled = schema_of({"enum": [{"a": 1, "b": [1, 2]}, [True, None], "x y"]})
    for text in (
        b'{"a": 1, "b": [1, 2]}',
        b'{"a":1,"b":[1,2]}',
        b'{"a":1, "b":[1, 2]}',
        b"[true, null]",
        b'"x y"',
    ):
        assert accepts(compiled, text), text
    for text in (b'{ "a": 1, "b": [1, 2]}', b'{"a":  1,"b":[1,2]}', b'{"b": [1, 2], "a": 1}', b'"x  y"'):
        assert not accepts(compiled, text), text
    assert accepts(schema_of({"const": {"k": "v"}}), b'{"k": "v"}')


BASE = {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1}}, "required": ["id"]}


def test_all_of_merges_its_members_and_the_keywords_beside_it() -> None:
    schema = {
        "$defs": {"base": BASE},
        "type": "object",
        "description": "a pet",
        "allOf": [
            {"$ref": "#/$defs/base"},
            {"properties": {"name": {"type": "string", "maxLength": 5}}, "required": ["name"]},
        ],
    }
    compiled = schema_of(schema)
    assert accepts(compiled, b'{"id": 3, "name": "rex"}')
    for text in (
        b'{"id": 3}',
        b'{"name": "rex"}',
        b'{"id": 0, "name": "rex"}',
        b'{"id": 3, "name": "toolong"}',
    ):
        assert not accepts(compiled, text), text
    check_walks(schema, compiled, range(20))


def test_a_property_in_two_all_of_members_takes_both_schemas() -> None:
    low = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 2}}}
    compiled = schema_of({"allOf": [low, {"properties": {"n": {"maximum": 4}}, "required": ["n"]}]})
    found = [accepts(compiled, f'{{"n": {n}}}'.encode()) for n in range(1, 6)]
    assert found == [False, True, True, True, False]


def test_all_of_members_with_no_type_in_common_are_unsatisfiable() -> None:
    refused({"allOf": [{"type": "string"}, {"type": ["object", "null"]}]}, "CONSTRAINT_UNSATISFIABLE")
    integers = schema_of({"allOf": [{"type": ["number", "string"]}, {"type": "integer"}]})
    assert accepts(integers, b"7") and not accepts(integers, b"7.5") and not accepts(integers, b'"7"')


def test_an_alternative_whose_merged_members_share_no_type_drops_out_alone() -> None:
    """A condition's then merged into a property whose oneOf has a branch of another type: that
    branch admits nothing, the others stay (Schema Store's abc-supply-plan)."""
    schema = {
        "type": "object",
        "required": ["q"],
        "properties": {"q": {"oneOf": [{"type": "string", "enum": ["a"]}, {"type": "null"}]}},
        "if": {"properties": {"k": {"const": 1}}},
        "then": {"properties": {"q": {"type": "null"}}},
    }
    compiled = schema_of(schema)
    assert accepts(compiled, b'{"q":null}') and not accepts(compiled, b'{"q":"a"}')


def test_keywords_beside_a_ref_or_an_any_of_hold_too() -> None:
    point = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    typed_ref = schema_of(
        {"$defs": {"p": point}, "$ref": "#/$defs/p", "type": "object", "properties": {"x": {"maximum": 9}}}
    )
    assert accepts(typed_ref, b'{"x": 9}') and not accepts(typed_ref, b'{"x": 10}')
    nullable = schema_of({"type": ["string", "null"], "anyOf": [{"maxLength": 2}, {"const": None}]})
    assert [accepts(nullable, t) for t in (b'"ab"', b"null", b'"abc"', b"3")] == [True, True, False, False]
    kinds = [{"properties": {"kind": {"const": k}}} for k in "ab"]
    either = schema_of({"type": "object", "required": ["kind"], "oneOf": kinds})
    assert accepts(either, b'{"kind": "a"}') and accepts(either, b'{"kind": "b"}')
    assert not accepts(either, b'{"kind": "c"}') and not accepts(either, b"{}")


def test_a_recursive_ref_with_keywords_beside_it_stops_at_the_documented_depth() -> None:
    node = {"type": "object", "properties": {"next": {"$ref": "#/$defs/node", "type": "object"}}}
    compiled = schema_of({"$defs": {"node": node}, "$ref": "#/$defs/node"})
    assert accepts(compiled, b'{"next": {"next": {}}}')
    assert not accepts(compiled, b'{"next": {"next": {"next": {"next": {}}}}}')


def test_property_counts_hold_on_maps_and_where_declared_properties_always_meet_them() -> None:
    some = schema_of(
        {
            "type": "object",
            "additionalProperties": {"type": "integer"},
            "minProperties": 1,
            "maxProperties": 2,
        }
    )
    found = [accepts(some, t) for t in (b"{}", b'{"a": 1}', b'{"a": 1, "b": 2}', b'{"a": 1, "b": 2, "c": 3}')]
    assert found == [False, True, True, False]
    declared = schema_of(
        {
            "type": "object",
            "properties": {"a": {}, "b": {}},
            "required": ["a"],
            "minProperties": 1,
            "maxProperties": 2,
        }
    )
    assert accepts(declared, b'{"a": 1}') and accepts(declared, b'{"a": 1, "b": 2}')


def test_a_regex_format_admits_regexes_and_refuses_what_no_dialect_parses() -> None:
    compiled = schema_of({"type": "string", "format": "regex"})
    for good in [
        "",
        "abc",
        "^[a-z]+\\d$",
        "(?:a|b)+?",
        "(?P<n>x)",
        "(?<=a)b",
        "a{2,3}",
        "[]a]",
        "[\\]]",
        "a|",
        "(" * 10 + "a" + ")" * 10,
        'say \\"hi\\"',
        "[^]]",
        "[]-]",
    ]:
        assert accepts(compiled, json.dumps(good).encode()), good
    for bad in ["*", "\\", "a\\", "a**", "(a", "a)", "[a-z", "|+", "(*)", "(" * 11 + "a" + ")" * 11, "[]"]:
        assert not accepts(compiled, json.dumps(bad).encode()), bad


def test_other_members_keys_may_hold_escapes_of_characters_no_declared_name_holds() -> None:
    compiled = schema_of({"type": "object", "properties": {"_uid": {"type": "number"}}, "required": ["_uid"]})
    for key in ['a\\": ', "x\\ny", "tab\\there", "ok"]:
        assert accepts(compiled, b'{"_uid": 1, "' + key.encode() + b'": 2}'), key
    assert not accepts(compiled, b'{"_uid": 1, "\\u005fuid": 2}')  # spells _uid: no \\u escape
    assert not accepts(compiled, b'{"_uid": 1, "_uid": 2}')


def test_keywords_beside_a_ref_are_ignored_in_the_drafts_that_say_so() -> None:
    for draft, merged in [
        ("http://json-schema.org/draft-04/schema#", False),
        ("http://json-schema.org/draft-07/schema#", False),
        ("https://json-schema.org/draft/2020-12/schema", True),
        (None, True),
    ]:
        schema = {
            "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}}}},
            "type": "object",
            "properties": {"p": {"$ref": "#/$defs/point", "type": "string"}},
        }
        if draft:
            schema["$schema"] = draft
        compiled = schema_of(schema)
        assert accepts(compiled, b'{"p": {"x": 1}}') != merged, draft  # merged: an object and a string
    data = schema_of(
        {"$schema": "http://json-schema.org/draft-04/schema#", "enum": [{"$ref": "#", "type": "string"}]}
    )  # enum values are data, kept whole
    assert accepts(data, b'{"$ref": "#", "type": "string"}') and not accepts(data, b'{"$ref": "#"}')


def test_patterns_of_two_all_of_members_both_hold() -> None:
    compiled = schema_of({"allOf": [{"type": "string", "pattern": "^[a-z]+/"}, {"pattern": "csv$"}]})
    assert accepts(compiled, b'"text/csv"') and not accepts(compiled, b'"text/html"')
    assert not accepts(compiled, b'"Text/csv"')


def test_keywords_a_named_draft_does_not_define_are_ignored_as_its_validators_do() -> None:
    draft4 = "http://json-schema.org/draft-04/schema#"
    conditional = {
        "type": "object",
        "properties": {"if": {"type": "integer"}, "kind": {}, "key": {}},
        "if": {"properties": {"kind": {"const": "a"}}},
        "then": {"required": ["key"]},
    }
    ignored = schema_of({**conditional, "$schema": draft4})  # draft 4 has no if/then: never required
    assert accepts(ignored, b'{"kind": "a"}') and not accepts(ignored, b'{"if": "x"}')  # a name kept
    assert not accepts(schema_of(conditional), b'{"kind": "a"}')  # 2020-12's reading
    closed = {"type": "object", "properties": {"a": {}}, "unevaluatedProperties": False}
    assert accepts(schema_of({**closed, "$schema": "http://json-schema.org/draft-07/schema#"}), b'{"b": 1}')
    assert not accepts(schema_of(closed), b'{"b": 1}')


def test_an_enum_number_admits_every_writing_of_its_value() -> None:
    for schema in ({"enum": [2.0, "x"]}, {"const": 2}, {"const": [2.0]}):
        compiled = schema_of(schema)
        inside = (lambda t: b"[" + t + b"]") if isinstance(schema.get("const"), list) else (lambda t: t)
        assert all(accepts(compiled, inside(t)) for t in (b"2", b"2.0", b"2.00")), schema
        assert not accepts(compiled, inside(b"2.5")) and not accepts(compiled, inside(b"20")), schema
    tiny = schema_of({"const": 1e-07})
    assert accepts(tiny, b"1e-07") and accepts(tiny, b"0.0000001")


def test_property_counts_beside_required_properties_count_the_others() -> None:
    contacts = schema_of(
        {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
            "minProperties": 2,
            "maxProperties": 3,
            "additionalProperties": {"type": "string"},
        }
    )
    found = [
        accepts(contacts, t)
        for t in (
            b'{"name": "a"}',
            b'{"name": "a", "b": "c"}',
            b'{"name": "a", "b": "c", "d": "e"}',
            b'{"name": "a", "b": "c", "d": "e", "f": "g"}',
        )
    ]
    assert found == [False, True, True, False]
    exact = schema_of(
        {"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a", "b"], "maxProperties": 2}
    )
    assert accepts(exact, b'{"a": 1, "b": 2}') and not accepts(exact, b'{"a": 1, "b": 2, "c": 3}')
    refused({"type": "object", "required": ["a"], "minProperties": 3}, "SCHEMA_UNSUPPORTED")
    refused({"type": "object", "required": ["a", "b"], "maxProperties": 1}, "CONSTRAINT_UNSATISFIABLE")


def test_unique_items_holds_where_an_array_has_at_most_one_item_and_false_asks_nothing() -> None:
    one = schema_of({"type": "array", "items": {"type": "integer"}, "maxItems": 1, "uniqueItems": True})
    assert accepts(one, b"[3]") and not accepts(one, b"[3, 4]")
    many = schema_of({"type": "array", "items": {"type": "integer"}, "uniqueItems": False})
    assert accepts(many, b"[3, 3]")


def test_not_in_two_all_of_members_rules_out_what_either_does() -> None:
    schema = {
        "type": "object",
        "properties": {n: {"type": "integer"} for n in "abc"},
        "additionalProperties": False,
        "allOf": [{"not": {"required": ["a"]}}, {"not": {"required": ["b"]}}],
    }
    compiled, validator = schema_of(schema), jsonschema.Draft202012Validator(schema)
    for size in range(4):
        for names in itertools.permutations("abc", size):
            instance = dict.fromkeys(names, 1)
            text = json.dumps(instance, separators=(",", ":")).encode()
            assert accepts(compiled, text) == validator.is_valid(instance), text


def test_one_of_members_one_with_a_not_admit_no_value_both_meet() -> None:
    """GitHub o29445's containers: an image without both build_args and dockerfile, or a
    build_directory; a value meeting both members is refused."""
    schema = {
        "type": "object",
        "properties": {n: {"type": "integer"} for n in ("args", "dir", "file", "image", "x")},
        "additionalProperties": False,
        "oneOf": [{"not": {"required": ["args", "file"]}, "required": ["image"]}, {"required": ["dir"]}],
    }
    compiled, validator = schema_of(schema), jsonschema.Draft202012Validator(schema)
    for size in range(6):
        for names in itertools.permutations(schema["properties"], size):
            instance = dict.fromkeys(names, 1)
            if accepts(compiled, json.dumps(instance, separators=(",", ":")).encode()):
                assert validator.is_valid(instance), instance
    assert accepts(compiled, b'{"image":1,"file":1}') and accepts(compiled, b'{"dir":1,"x":1}')


def test_a_declared_name_a_pattern_finds_is_one_parse_not_two() -> None:
    """Each declared name a pattern also finds (with the same schema) is written as declared only:
    two readings per member would double the parses with every member (past the stack bound)."""
    names = [f"p{i}" for i in range(16)]
    schema = {
        "type": "object",
        "properties": {n: {"type": "integer"} for n in names},
        "patternProperties": {"^p": {"type": "integer"}},
    }
    compiled = schema_of(schema)
    assert isinstance(compiled, CompiledGrammar)
    text = json.dumps(dict.fromkeys(reversed(names), 1)).encode()
    state = compiled.after_bytes(compiled.initial, text[:-1])
    assert state is not None and len(state) <= 4 * len(names)
    assert accepts(compiled, text) and accepts(compiled, b'{"p1":1,"px":2,"p2":3}')
    assert not accepts(compiled, b'{"p1":1,"p1":2}')
