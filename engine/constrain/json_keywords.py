"""The keywords of JSON Schema as the compiler (json_schema.py) reads them: which constrain an
instance and which only annotate, the errors that name a keyword's pointer, and what one schema's
keywords say taken alone: allOf members merged into one schema (merge_into), numeric bounds,
counts, types, patterns, and the form of condition written exactly (tested).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from engine.constrain import regex
from engine.constrain.pattern import Node
from engine.errors import InvalidInput

FIELD = "json_schema"  # the input at fault, as the engine names it (service/errors.py: the request field)
OPEN = "$open"  # the rule of an open value at any depth ($ref targets start with "/" or are "")
ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$schema",
        "$id",
        "$comment",
        "readOnly",
        "writeOnly",
        "deprecated",
        "$defs",
        "definitions",
        "contentMediaType",
        "contentEncoding",
    }
)
TYPE_KEYWORDS = {
    "object": (
        "properties",
        "required",
        "additionalProperties",
        "minProperties",
        "maxProperties",
        "patternProperties",
        "unevaluatedProperties",
        "propertyNames",
    ),
    "array": (
        "items",
        "prefixItems",
        "additionalItems",
        "minItems",
        "maxItems",
        "uniqueItems",
        "unevaluatedItems",
        "contains",
        "minContains",
        "maxContains",
    ),
    "string": ("minLength", "maxLength", "pattern", "format"),
    "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
    "integer": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
    "boolean": (),
    "null": (),
}
COMBINATORS = ("$ref", "anyOf", "oneOf", "allOf")
MERGED = "$merged"  # set by allOf's merge: an enum it emptied admits nothing (not SCHEMA_INVALID)
EXCLUDED = "$excluded"  # values a condition's negation rules out (json_lowering): none fits
UNMATCHED = "$unmatched"  # patterns a `not` rules out: a string matches none of them
MATCHED = "$matched"  # patterns of other allOf members beside `pattern`: a string matches all of them
OWN_FIRST = "$ownFirst"  # set beside an anyOf/oneOf member: the keywords beside it merge first (their order)
# Set by dependencies (json_dependencies): [name, [names, ...]] pairs, "where name is written, all of
# one of those lists are too", kept by the object's members as sets (pattern.Members.rules).
DEPENDS = "$depends"
INTERNAL = frozenset({MERGED, EXCLUDED, UNMATCHED, MATCHED, OWN_FIRST, DEPENDS})
ALONE = "$alone"  # set by alone: additionalProperties was a member's own unevaluatedProperties
MAX_UNIQUE_VALUES = 64  # uniqueItems over an enum: the values its arrays choose from
MAX_NOT_BRANCHES = 16  # not of required lists: the choices of names left out written exactly
MAX_CONDITIONS = 3  # allOf members with if/then/else written as alternatives
MAX_CONDITION_BRANCHES = 4  # alternatives for one of them (its if and its not, each as _without writes it)
MAX_DEPENDENT_CHOICES = 16  # dependencies: the choices of optional names present written exactly
# Keywords rewritten into the others (json_lowering.py) before a schema is compiled.
LOWERED = frozenset({"if", "then", "else", "not", "dependencies", "dependentRequired", "dependentSchemas"})
KNOWN = (
    ANNOTATIONS
    | {"type", "enum", "const", *COMBINATORS}
    | {k for keys in TYPE_KEYWORDS.values() for k in keys}
)
# The keywords of drafts 4 to 2020-12 that constrain an instance (assertions and applicators).
# Those not KNOWN are refused; a keyword outside this set constrains nothing and is ignored.
ASSERTIONS = frozenset(
    {
        "type",
        "enum",
        "const",
        "multipleOf",
        "maximum",
        "exclusiveMaximum",
        "minimum",
        "exclusiveMinimum",
        "maxLength",
        "minLength",
        "pattern",
        "format",
        "items",
        "prefixItems",
        "additionalItems",
        "contains",
        "minContains",
        "maxContains",
        "maxItems",
        "minItems",
        "uniqueItems",
        "maxProperties",
        "minProperties",
        "required",
        "properties",
        "patternProperties",
        "additionalProperties",
        "dependencies",
        "dependentRequired",
        "dependentSchemas",
        "propertyNames",
        "allOf",
        "anyOf",
        "oneOf",
        "not",
        "if",
        "then",
        "else",
        "unevaluatedItems",
        "unevaluatedProperties",
        "$ref",
        "$dynamicRef",
        "$recursiveRef",
    }
)


def unsupported(pointer: str, what: str) -> InvalidInput:
    return InvalidInput(
        f"{pointer or '/'}: {what} is not supported in JSON schema constraints",
        reason="SCHEMA_UNSUPPORTED",
        field=FIELD,
    )


def invalid(pointer: str, what: str) -> InvalidInput:
    return InvalidInput(f"{pointer or '/'}: {what}", reason="SCHEMA_INVALID", field=FIELD)


def merge_into(merged: dict[str, Any], schema: dict[str, Any], pointer: str) -> None:
    """Add one allOf member's assertion keywords to `merged`: properties of both (a property in
    both: allOf of its two schemas), required of both, the types both allow; any other keyword
    must be absent from one or equal in both (SCHEMA_UNSUPPORTED naming it otherwise). A member's
    additionalProperties sees its own properties alone, so where one side has one, the other side
    may declare no property it does not (refused otherwise: the merge would admit them). anyOf in
    both: an alternative per pair of theirs (up to MAX_NOT_BRANCHES); not in both: not of either."""
    for closed, other in ((merged, schema), (schema, merged)):
        if closed.get("additionalProperties", True) is not True:
            extra = set(other.get("properties", {})) - set(closed.get("properties", {}))
            key = "unevaluatedProperties" if closed.get(ALONE) else "additionalProperties"
            if extra:
                raise unsupported(
                    f"{pointer}/{key}",
                    f"allOf members where {key} rules out {sorted(extra)[0]!r}, "
                    "a property another member declares",
                )
    positional = [_item_keywords(side) for side in (merged, schema)]
    if (by_position(merged) or by_position(schema)) and all(positional) and positional[0] != positional[1]:
        raise unsupported(
            f"{pointer}/{next(iter(positional[1]))}",
            "allOf members with items by position and other item keywords",
        )
    for key, value in schema.items():
        if key not in merged:
            merged[key] = value
        elif key == "properties" and isinstance(value, dict) and isinstance(merged[key], dict):
            both = dict(merged[key])
            for name, sub in value.items():
                both[name] = sub if name not in both or both[name] == sub else {"allOf": [both[name], sub]}
            merged[key] = both
        elif key == "items" and isinstance(value, dict | bool) and isinstance(merged[key], dict | bool):
            merged[key] = {"allOf": [merged[key], value]}  # every item meets both
        elif key == "required" and isinstance(value, list) and isinstance(merged[key], list):
            merged[key] = list(dict.fromkeys([*merged[key], *value]))
        elif key == "type":
            merged[key] = types_in_both(merged[key], value, pointer)
        elif key in (EXCLUDED, UNMATCHED, MATCHED, DEPENDS):
            merged[key] = [*merged[key], *value]
        elif key == "pattern" and merged[key] != value:  # both hold: their automata intersected
            merged[MATCHED] = [*merged.get(MATCHED, []), value]
        elif key == "enum" and isinstance(value, list) and isinstance(merged[key], list):
            theirs = {json_key(v) for v in value}  # both: the values in both (none: nothing fits)
            merged[key] = [v for v in merged[key] if json_key(v) in theirs]
            merged[MERGED] = True
        elif key == "const" and json_key(merged[key]) != json_key(value):  # no value is both
            merged["enum"] = []
            merged[MERGED] = True
        elif (
            key == "anyOf"
            and merged[key] != value
            and isinstance(value, list)
            and isinstance(merged[key], list)
        ):
            # (A1 or A2) and (B1 or B2): one alternative per pair that meets both.
            if len(merged[key]) * len(value) > MAX_NOT_BRANCHES:
                raise unsupported(
                    f"{pointer}/anyOf",
                    f"'anyOf' in two allOf members of more than {MAX_NOT_BRANCHES} pairs of alternatives",
                )
            merged[key] = [{"allOf": [mine, theirs]} for mine in merged[key] for theirs in value]
        elif key == "not" and merged[key] != value:  # neither: not (either)
            merged[key] = {"anyOf": [*_either(merged[key]), *_either(value)]}
        elif merged[key] != value:
            raise unsupported(
                f"{pointer}/{escape(key)}", f"{key!r} in more than one allOf member with different values"
            )


def _either(schema: Any) -> list[Any]:
    """A `not`'s schema as anyOf members: an anyOf alone is its members (so nots merged into one
    stay one anyOf of what each ruled out)."""
    if isinstance(schema, dict) and set(schema) == {"anyOf"} and isinstance(schema["anyOf"], list):
        return list(schema["anyOf"])
    return [schema]


def properties_lead(schema: dict[str, Any], *applicators: str) -> bool:
    """Whether a schema's own properties come before what its applicators ($ref, allOf) bring: set
    so (OWN_FIRST), or `properties` written ahead of them (a schema is read in its keys' order,
    as llguidance orders properties)."""
    if schema.get(OWN_FIRST):
        return True
    keys = list(schema)
    if "properties" not in keys:
        return False
    after = [keys.index(a) for a in applicators if a in keys]
    return bool(after) and keys.index("properties") < min(after)


ITEM_KEYWORDS = ("prefixItems", "items", "additionalItems", "unevaluatedItems")


def _item_keywords(schema: dict[str, Any]) -> dict[str, Any]:
    return {k: schema[k] for k in ITEM_KEYWORDS if k in schema}


def by_position(schema: dict[str, Any]) -> bool:
    """Whether a schema gives its first items schemas of their own (prefixItems, items as a list)."""
    return "prefixItems" in schema or isinstance(schema.get("items"), list)


def tested(condition: Any) -> tuple[str, list[Any], bool] | None:
    """(property, the values it must have, whether the condition requires it) for a condition of
    the form {"properties": {p: {"const": v} or {"enum": [...]} or an anyOf of those (or of
    {"type": "null"})}} with an optional "required": [p]; None for any other condition."""
    if not isinstance(condition, dict):
        return None
    own = {k: v for k, v in condition.items() if k in ASSERTIONS}
    properties, required = own.pop("properties", None), own.pop("required", [])
    own.pop("type", None) if own.get("type") == "object" else None
    if own or not isinstance(properties, dict) or len(properties) != 1:
        return None
    ((name, test),) = properties.items()
    if not isinstance(test, dict) or required not in ([], [name]):
        return None
    values = _values_of(test)
    return None if values is None else (name, values, bool(required))


def _values_of(test: Any) -> list[Any] | None:
    """The values a test admits when it is a const, an enum, `{"type": "null"}` or an anyOf of
    those; None otherwise."""
    asserted = {k: v for k, v in test.items() if k in ASSERTIONS} if isinstance(test, dict) else {}
    if set(asserted) == {"const"}:
        return [asserted["const"]]
    if set(asserted) == {"enum"} and isinstance(asserted["enum"], list) and asserted["enum"]:
        return list(asserted["enum"])
    if asserted == {"type": "null"}:
        return [None]
    if set(asserted) == {"anyOf"} and isinstance(asserted["anyOf"], list) and asserted["anyOf"]:
        found = [_values_of(member) for member in asserted["anyOf"]]
        return None if any(f is None for f in found) else [v for f in found for v in f or []]
    return None


def alone(member: dict[str, Any]) -> dict[str, Any]:
    """A merged member's keywords as the merge sees them: the member's own unevaluatedProperties
    (unevaluatedItems) saw only the properties (items) the member evaluates, so beside the other
    members it is the member's additionalProperties (items), and moot beside one it has."""
    out = dict(member)
    for unevaluated, additional in (
        ("unevaluatedProperties", "additionalProperties"),
        ("unevaluatedItems", "items"),
    ):
        if unevaluated in out:
            value = out.pop(unevaluated)
            if additional not in out:
                out[additional] = value
                out[ALONE] = out.get(ALONE, False) or unevaluated == "unevaluatedProperties"
    return out


def types_in_both(a: Any, b: Any, pointer: str) -> list[str]:
    first: list[str] = [a] if isinstance(a, str) else list(a)
    second: list[str] = [b] if isinstance(b, str) else list(b)
    both = [t for t in first if t in second or (t == "integer" and "number" in second)]
    both += [t for t in second if t == "integer" and "number" in first and t not in both]
    if not both:
        raise InvalidInput(
            f"{pointer}/type: allOf members allow no type in common",
            reason="CONSTRAINT_UNSATISFIABLE",
            field=FIELD,
        )
    return both


LOWER_BOUNDS = ("minimum", "exclusiveMinimum")


def bounds(schema: dict[str, Any], pointer: str) -> dict[str, tuple[int | float, bool]]:
    """Each bound keyword present: (its value, whether it is exclusive). Draft 4's boolean
    exclusiveMinimum/exclusiveMaximum make minimum/maximum exclusive instead."""
    found: dict[str, tuple[int | float, bool]] = {}
    for key, exclusive in (
        ("minimum", False),
        ("exclusiveMinimum", True),
        ("maximum", False),
        ("exclusiveMaximum", True),
    ):
        value = schema.get(key)
        if value is None or isinstance(value, bool) and exclusive:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise invalid(f"{pointer}/{key}", f"{key} must be a number")
        draft4 = {"minimum": "exclusiveMinimum", "maximum": "exclusiveMaximum"}.get(key)
        found[key] = (value, exclusive or bool(draft4 and schema.get(draft4) is True))
    return found


def integer_bounds(schema: dict[str, Any], pointer: str) -> tuple[int | None, int | None]:
    lows: list[int] = []
    highs: list[int] = []
    for key, (value, exclusive) in bounds(schema, pointer).items():
        low = key in LOWER_BOUNDS
        edge = (
            math.floor(value) + 1
            if exclusive and low
            else math.ceil(value)
            if low
            else (math.ceil(value) - 1 if exclusive else math.floor(value))
        )
        (lows if low else highs).append(int(edge))
    return (max(lows) if lows else None), (min(highs) if highs else None)


def count(schema: dict[str, Any], key: str, pointer: str, default: int | None) -> int | None:
    if key not in schema:
        return default
    value = schema[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise invalid(f"{pointer}/{key}", f"{key} must be a non-negative integer")
    return value


def is_type(value: Any, name: str) -> bool:
    if name in ("integer", "number"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            return False
        return name == "number" or isinstance(value, int) or value.is_integer()
    kinds = {"string": str, "boolean": bool, "object": dict, "array": list}
    return value is None if name == "null" else isinstance(value, kinds[name])


def parsed(source: Any, pointer: str) -> Node:
    if not isinstance(source, str):
        raise invalid(pointer, "pattern must be a string")
    try:
        return regex.parse(source, FIELD)
    except InvalidInput as exc:
        if exc.reason == "REGEX_INVALID" and re.search(r"\\[pP]\{", source):  # ECMA-262's, not Python's
            raise unsupported(pointer, "a Unicode property escape (\\p{...})") from exc
        if exc.reason == "REGEX_INVALID":
            raise invalid(pointer, str(exc)) from exc
        raise unsupported(pointer, str(exc)) from exc


def search(source: Any, name: str, pointer: str) -> bool:
    """Whether a propertyNames pattern finds a match in a declared name (Python's re reads it)."""
    if not isinstance(source, str):
        raise invalid(pointer, "pattern must be a string")
    try:
        return re.search(source, name) is not None
    except re.error as exc:
        raise unsupported(pointer, f"the pattern {source!r} ({exc})") from exc


def finds(source: str, name: str) -> bool:
    """Whether the pattern finds a match in `name` (Python's re for the check; a pattern it cannot
    read counts as finding one: the caller then asks the stricter question)."""
    try:
        return re.search(source, name) is not None
    except re.error:
        return True


def json_key(value: Any) -> str:
    """A JSON value's identity for enum and const (1 and 1.0 are one number, as JSON Schema has it)."""
    return (
        json.dumps(value, sort_keys=True)
        if not isinstance(value, float) or not value.is_integer()
        else json.dumps(int(value))
    )


def escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")
