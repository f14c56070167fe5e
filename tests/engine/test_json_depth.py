"""JSON nesting is measured on the text, before any parser recurses into it."""

from __future__ import annotations

import pytest

from engine.constrain.json_schema import tree
from engine.errors import InvalidInput
from engine.json_depth import MAX_JSON_DEPTH, check_json_depth, json_depth


def test_depth_counts_arrays_and_objects_and_not_brackets_inside_strings() -> None:
    assert json_depth('{"a": [1, {"b": "[[[[{{"}], "c": "\\"]["}') == 3
    assert json_depth("3") == json_depth(b'"[["') == 0


def test_text_nested_a_hundred_thousand_deep_is_refused_naming_the_limit_without_recursing() -> None:
    with pytest.raises(InvalidInput, match=f"limit of {MAX_JSON_DEPTH} levels") as caught:
        check_json_depth(b"[" * 100_000 + b"]" * 100_000)
    assert caught.value.reason == "JSON_TOO_DEEP"
    check_json_depth("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH)  # at the limit: accepted


def test_a_json_schema_nested_past_the_limit_is_invalid_input_not_a_recursion_error() -> None:
    schema = '{"type": "array", "items": ' * 10_000 + '{"type": "integer"}' + "}" * 10_000
    with pytest.raises(InvalidInput) as caught:
        tree(schema)
    assert caught.value.field == "json_schema" and caught.value.reason == "JSON_TOO_DEEP"
