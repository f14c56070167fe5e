"""A schema that names draft 3 to 7 in its `$schema`, read as that draft's validators read it:
the keywords the draft does not define left out, and the assertion keywords beside a `$ref`
(those drafts ignore a $ref's siblings). 2019-09 and later, and a schema without `$schema`
(validators read it as the latest), are left as they are.
"""

from __future__ import annotations

from typing import Any

from engine.constrain.json_keywords import ASSERTIONS

# Keywords a draft does not define, so its validators ignore them (2019-09's in drafts 3 to 7, draft
# 7's conditionals in 3 to 6, draft 6's const/contains/propertyNames in 3 and 4).
_LATER = frozenset(
    {
        "dependentRequired",
        "dependentSchemas",
        "prefixItems",
        "unevaluatedProperties",
        "unevaluatedItems",
        "minContains",
        "maxContains",
    }
)
_DRAFTS: dict[str, frozenset[str]] = {
    "draft-03/": _LATER | {"if", "then", "else", "const", "contains", "propertyNames"},
    "draft-04/": _LATER | {"if", "then", "else", "const", "contains", "propertyNames"},
    "draft-06/": _LATER | {"if", "then", "else"},
    "draft-07/": _LATER,
}


def unknown_to_draft(root: Any) -> frozenset[str] | None:
    """The keywords the draft the schema names (`$schema`, drafts 3 to 7) does not define; None
    for 2019-09 and later, and without a `$schema` (read as the latest, as validators do)."""
    declared = root.get("$schema") if isinstance(root, dict) else None
    if not isinstance(declared, str):
        return None
    return next((unknown for draft, unknown in _DRAFTS.items() if draft in declared), None)


def _as_draft(schema: Any, unknown: frozenset[str]) -> Any:
    """The schema as a draft 3 to 7 validator reads it: keywords that draft does not define left
    out, and the assertion keywords beside a $ref too (those drafts ignore a $ref's siblings).
    Values of enum, const, default and examples are data, and the keys of properties-like maps
    names: both kept as they are."""
    if isinstance(schema, list):
        return [_as_draft(item, unknown) for item in schema]
    if not isinstance(schema, dict):
        return schema
    ref = isinstance(schema.get("$ref"), str)
    kept: dict[str, Any] = {}
    for key, value in schema.items():
        if key in unknown or ref and key != "$ref" and key in ASSERTIONS:
            continue
        if key in _DATA:
            kept[key] = value
        elif key in _NAME_MAPS and isinstance(value, dict):
            kept[key] = {name: _as_draft(sub, unknown) for name, sub in value.items()}
        else:
            kept[key] = _as_draft(value, unknown)
    return kept


_NAME_MAPS = frozenset(
    {"properties", "patternProperties", "definitions", "$defs", "dependencies", "dependentSchemas"}
)
_DATA = frozenset({"enum", "const", "default", "examples"})


def as_named_draft(root: Any) -> Any:
    """The schema as the draft its `$schema` names reads it (unchanged for 2019-09 and later)."""
    unknown = unknown_to_draft(root)
    return root if unknown is None else _as_draft(root, unknown)
