"""Whether two JSON Schemas can hold one value, as far as their own keywords show (oneOf's
members need nothing more to be exactly one: json_one_of.py): types, const/enum values, item
counts and lengths with none in common, or a required property the other never admits."""

from __future__ import annotations

from typing import Any

from engine.constrain.json_keywords import json_key


def disjoint(first: Any, second: Any) -> bool:
    """Whether no instance can meet both schemas, as far as their own keywords show: types with
    none in common, const/enum values with none in common, or a property one of them requires
    whose const/enum values, or item counts or lengths, in the two have none in common (a
    discriminator; `from` with one item against `from` with two or more)."""
    if first is False or second is False:
        return True
    if not isinstance(first, dict) or not isinstance(second, dict):
        return False
    types = [_declared_types(s) for s in (first, second)]
    if types[0] is not None and types[1] is not None and not _types_meet(types[0], types[1]):
        return True
    if _apart(_fixed_values(first), _fixed_values(second)) or _counts_apart(first, second):
        return True
    own: list[dict[str, Any]] = [
        s["properties"] if isinstance(s.get("properties"), dict) else {} for s in (first, second)
    ]
    needed = {n for s in (first, second) if isinstance(s.get("required"), list) for n in s["required"]}
    if _forbids_required(first, second) or _forbids_required(second, first):
        return True
    return any(
        _apart(_fixed_values(own[0][name]), _fixed_values(own[1][name]))
        or _counts_apart(own[0][name], own[1][name])
        for name in set(own[0]) & set(own[1]) & needed
    )


def _forbids_required(first: dict[str, Any], second: dict[str, Any]) -> bool:
    """Whether an object `first` requires holds a name `second` never admits (declared False, or
    left out by `"additionalProperties": false` with no patternProperties), and both admit only
    one of them admits only objects, so nothing meets both."""
    if _declared_types(first) != ["object"] and _declared_types(second) != ["object"]:
        return False
    required = first.get("required")
    properties = second.get("properties")
    own: dict[str, Any] = properties if isinstance(properties, dict) else {}
    closed = second.get("additionalProperties") is False and not second.get("patternProperties")
    return isinstance(required, list) and any(
        isinstance(name, str) and (own.get(name) is False or closed and name not in own) for name in required
    )


_COUNTS = (("array", "minItems", "maxItems"), ("string", "minLength", "maxLength"))


def _counts_apart(first: Any, second: Any) -> bool:
    """Whether two schemas, one of which admits only arrays (strings), give item counts (lengths)
    with none in common: whatever meets both is an array (a string) neither count allows."""
    if not isinstance(first, dict) or not isinstance(second, dict):
        return False
    for kind, low, high in _COUNTS:
        if [kind] not in (_declared_types(first), _declared_types(second)):
            continue
        spans = []
        for schema in (first, second):
            lo, hi = schema.get(low, 0), schema.get(high)
            if (
                not isinstance(lo, int)
                or isinstance(lo, bool)
                or hi is not None
                and (not isinstance(hi, int) or isinstance(hi, bool))
            ):
                break
            spans.append((lo, hi))
        else:
            (lo1, hi1), (lo2, hi2) = spans
            if hi1 is not None and hi1 < lo2 or hi2 is not None and hi2 < lo1:
                return True
    return False


def _declared_types(schema: dict[str, Any]) -> list[str] | None:
    declared = schema.get("type")
    if isinstance(declared, str):
        return [declared]
    return declared if isinstance(declared, list) and all(isinstance(t, str) for t in declared) else None


def _types_meet(first: list[str], second: list[str]) -> bool:
    return any(t in second or {t, u} == {"integer", "number"} for t in first for u in second)


def _fixed_values(schema: Any) -> list[Any] | None:
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return [schema["const"]]
    return schema["enum"] if isinstance(schema.get("enum"), list) else None


def _apart(first: list[Any] | None, second: list[Any] | None) -> bool:
    return (
        first is not None
        and second is not None
        and not {json_key(v) for v in first} & {json_key(v) for v in second}
    )
