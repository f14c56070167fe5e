"""JSON Schema arrays as syntax trees: items (a schema, or prefixItems/items by position),
minItems/maxItems, contains, uniqueItems (of few values). What they ask of the compile: Subschemas."""

from __future__ import annotations

import json
from typing import Any

from engine.constrain import json_keywords as kw
from engine.constrain import json_values as jv
from engine.constrain.json_keywords import ASSERTIONS, MAX_UNIQUE_VALUES, TYPE_KEYWORDS, invalid, unsupported
from engine.constrain.json_parts import Subschemas
from engine.constrain.pattern import EMPTY, Node, alt, members, repeat, seq, text


def compiled(c: Subschemas, schema: dict[str, Any], pointer: str) -> Node:
    prefix, (items, at) = _positions(c, schema, pointer)
    lo = kw.count(schema, "minItems", pointer, 0)
    hi = kw.count(schema, "maxItems", pointer, None)
    unique = schema.get("uniqueItems", False)
    if not isinstance(unique, bool):
        raise invalid(f"{pointer}/uniqueItems", "uniqueItems must be a boolean")
    if unique and (hi is None or hi > 1):  # at most one item: unique whatever it is
        if prefix:
            raise unsupported(f"{pointer}/uniqueItems", "'uniqueItems' beside items by position")
        return _unique_values(c, items, lo or 0, hi, pointer)
    if "contains" in schema:
        for key in ("maxContains", "unevaluatedItems"):  # counts; items contains evaluates
            if key in schema:
                raise unsupported(f"{pointer}/{key}", f"{key!r} beside 'contains'")
        if kw.count(schema, "minContains", pointer, 1) != 0:
            return _containing(c, schema, items, at, bool(prefix), lo or 0, hi, pointer)
    rest = c.node(items, at)
    if not prefix:
        return jv.array(rest, lo or 0, hi)
    return jv.positional_array([c.node(s, p) for s, p in prefix], rest, lo or 0, hi)


def _containing(
    c: Subschemas,
    schema: dict[str, Any],
    items: Any,
    at: str,
    by_position: bool,
    lo: int,
    hi: int | None,
    pointer: str,
) -> Node:
    """contains (minContains 1, no maxContains): one item meets both items and contains, the
    others items alone, any number before and after it, within minItems at most 1 and no
    maxItems; any other count is SCHEMA_UNSUPPORTED."""
    for key in ("prefixItems", "maxItems"):
        if key in schema or key == "prefixItems" and by_position:
            raise unsupported(f"{pointer}/{key}", f"{key!r} beside 'contains'")
    if kw.count(schema, "minContains", pointer, 1) != 1 or lo > 1:
        key = "minContains" if "minContains" in schema else "minItems"
        raise unsupported(f"{pointer}/{key}", f"{key!r} above 1 beside 'contains'")
    other = c.node(items, at)
    where = f"{pointer}/contains"
    found = c.merged([(items, at), (schema["contains"], where)], where)
    return seq(
        text("["),
        repeat(seq(other, jv.COMMA), 0, None),
        found,
        repeat(seq(jv.COMMA, other), 0, None),
        text("]"),
    )


def _positions(
    c: Subschemas, schema: dict[str, Any], pointer: str
) -> tuple[list[tuple[Any, str]], tuple[Any, str]]:
    """The schemas of the first items, each with its pointer (2020-12's prefixItems, or items as
    a list in the drafts before it), and the schema of every later item (items beside
    prefixItems, additionalItems beside a list; none of them: unevaluatedItems, else any)."""
    unevaluated = (schema.get("unevaluatedItems", True), f"{pointer}/unevaluatedItems")
    items = schema.get("items")
    if "prefixItems" in schema:
        if isinstance(items, list):
            raise invalid(f"{pointer}/items", "items must be a schema beside prefixItems")
        listed, key = schema["prefixItems"], "prefixItems"
        rest = (items, f"{pointer}/items") if "items" in schema else unevaluated
    elif isinstance(items, list):
        listed, key = items, "items"
        rest = (
            (schema["additionalItems"], f"{pointer}/additionalItems")
            if "additionalItems" in schema
            else unevaluated
        )
    else:  # additionalItems beside no list of items evaluates nothing
        return [], ((items, f"{pointer}/items") if "items" in schema else unevaluated)
    if not isinstance(listed, list):
        raise invalid(f"{pointer}/{key}", f"{key} must be a list of schemas")
    return [(s, f"{pointer}/{key}/{i}") for i, s in enumerate(listed)], rest


def _unique_values(c: Subschemas, items: Any, lo: int, hi: int | None, pointer: str) -> Node:
    """uniqueItems over items that are an enum (or const) of at most MAX_UNIQUE_VALUES values:
    each value at most once, in the enum's order (so no two equal); minItems at most 1 and a
    maxItems no lower than the number of values. Any other uniqueItems is refused."""
    own = {k: v for k, v in items.items() if k in ASSERTIONS} if isinstance(items, dict) else {}
    key = "const" if "const" in own else "enum"
    values = [own["const"]] if key == "const" else own.get("enum")
    if not isinstance(values, list) or not own.keys() <= {key, "type"} or not values:
        raise unsupported(
            f"{pointer}/uniqueItems",
            "'uniqueItems' true on more than one item, other than of an enum's values",
        )
    types = c.types(own, f"{pointer}/items") if "type" in own else list(TYPE_KEYWORDS)
    kept = list(
        {json.dumps(v, sort_keys=True): v for v in values if any(kw.is_type(v, t) for t in types)}.values()
    )
    if len(kept) > MAX_UNIQUE_VALUES or lo > 1 or hi is not None and hi < len(kept):
        raise unsupported(
            f"{pointer}/uniqueItems",
            f"'uniqueItems' over more than {MAX_UNIQUE_VALUES} "
            "values, or beside a minItems above 1 or a maxItems below their number",
        )
    literals = [jv.literal(v) for v in kept]
    # Non-empty: the first value written is i-th, then any of the later ones, in order.
    filled = alt(
        *(
            members([(literals[i], True), *((v, False) for v in literals[i + 1 :])], jv.COMMA)
            for i in range(len(literals))
        )
    )
    body = filled if lo == 1 else alt(filled, EMPTY)
    return seq(text("["), body, text("]"))
