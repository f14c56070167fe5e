"""JSON Schema's if/then/else, not, dependencies, dependentRequired and dependentSchemas written
as the other keywords (`lowered`), each admitting every output it makes or a part of them, never
one the original rejects, or refused naming the keyword. What they need of the compile: Subschemas."""

from __future__ import annotations

import itertools
from typing import Any

from engine.constrain import json_keywords as kw
from engine.constrain.json_dependencies import dependent
from engine.constrain.json_keywords import (
    ASSERTIONS,
    EXCLUDED,
    LOWERED,
    MAX_CONDITION_BRANCHES,
    MAX_CONDITIONS,
    MAX_NOT_BRANCHES,
    TYPE_KEYWORDS,
    UNMATCHED,
    invalid,
    unsupported,
)
from engine.constrain.json_parts import Combining, Subschemas
from engine.constrain.pattern import Node, alt
from engine.errors import InvalidInput


def lowered(c: Subschemas, schema: dict[str, Any], pointer: str) -> Node:
    """if/then/else, not, dependencies and dependentRequired/dependentSchemas as schemas of the
    other keywords, each admitting every output it makes or a part of them (never one the
    original rejects), or refused naming the keyword:
    - if/then/else on an object schema whose conditions (its own and its allOf members')
      test one property's value against a const or enum: exactly (_discriminated); other
      conditions: `then` held always (if no else), else the union of "then and else both"
      and "if and then" (the alternatives that compile);
    - not: of `required` lists (or an anyOf of them), one name of each list that is not
      required left out (a declared property, never written): every choice of names, one
      alternative each, up to MAX_NOT_BRANCHES (exact), else the last of each; of `type`,
      those types removed;
    - dependencies: an optional declared property present with what it asks, or absent, one
      alternative per choice (_dependent: up to MAX_NOT_BRANCHES, else its names required
      whenever it is declared and, with a dependent schema, the property left out); a
      required property's dependent schema held."""
    base: Any = {k: v for k, v in schema.items() if k not in LOWERED}
    if "if" in schema or "then" in schema or "else" in schema:
        return _conditional(c, schema, base, pointer)
    bases = [base]
    if "not" in schema:
        bases = _without(c, schema["not"], base, f"{pointer}/not")
    return alt(*(_dependents(c, schema, b, pointer) for b in bases))


def _dependents(c: Subschemas, schema: dict[str, Any], base: dict[str, Any], pointer: str) -> Node:
    options: list[tuple[dict[str, Any], list[tuple[Any, str]]]] = [(base, [])]
    for key in ("dependencies", "dependentRequired", "dependentSchemas"):
        if key in schema:
            options = [
                (after, schemas + more)
                for before, schemas in options
                for after, more in dependent(c, schema[key], before, f"{pointer}/{key}")
            ]
    return _compiling(c, [[(option, pointer), *schemas] for option, schemas in options], pointer)


def _conditional(c: Subschemas, schema: dict[str, Any], base: dict[str, Any], pointer: str) -> Node:
    rest = {k: v for k, v in schema.items() if k not in ("if", "then", "else")}
    exact = exactly(
        c,
        rest,
        [(schema.get("if", True), schema.get("then", True), schema.get("else", True), pointer)],
        pointer,
    )
    if exact is not None:
        return exact
    then, otherwise = schema.get("then", True), schema.get("else")
    if "if" not in schema:  # then and else assert nothing without an if
        return c.node(rest, pointer)
    if schema["if"] is False:  # else alone holds
        otherwise = True if otherwise is None else otherwise
        return c.merged([(rest, pointer), (otherwise, f"{pointer}/else")], pointer)
    if schema["if"] is True:
        return c.merged([(rest, pointer), (then, f"{pointer}/then")], pointer)
    try:  # where `not` of the if can be written: "if and then" or "not if and else", exactly
        negated: list[dict[str, Any]] | None = _without(c, schema["if"], rest, f"{pointer}/if")
    except InvalidInput as exc:
        if exc.reason != "SCHEMA_UNSUPPORTED":
            raise
        negated = None
    exact_options = (
        None
        if negated is None
        else [
            [(rest, pointer), (schema["if"], f"{pointer}/if"), (then, f"{pointer}/then")],
            *([(b, pointer), (True if otherwise is None else otherwise, f"{pointer}/else")] for b in negated),
        ]
    )
    if exact_options is not None:
        whole = _all_compiling(c, exact_options, pointer)
        if whole is not None:
            return whole
    try:  # then always (no else); else "then and else both" or "if and then"
        if otherwise is None:
            return c.merged([(rest, pointer), (then, f"{pointer}/then")], pointer)
        given = (schema["if"], f"{pointer}/if")
        return _compiling(
            c,
            [
                [(rest, pointer), (then, f"{pointer}/then"), (otherwise, f"{pointer}/else")],
                [(rest, pointer), given, (then, f"{pointer}/then")],
            ],
            pointer,
        )
    except InvalidInput as exc:
        if exc.reason != "SCHEMA_UNSUPPORTED" or exact_options is None:
            raise
        return _compiling(c, exact_options, pointer)  # the exact alternatives that compile


def conditions_apart(c: Combining, schema: dict[str, Any], pointer: str) -> Node | None:
    """An allOf whose members (a $ref's or a nested allOf's too) hold if/then/else, as
    alternatives: for the first such member "if and then" and "not if and else" (each then
    compiled the same way, for the next), exactly where the if and its `not` can be written
    (_holding, _without); None where they cannot, past MAX_CONDITIONS members with an if or
    MAX_CONDITION_BRANCHES alternatives for one (flattened then holds a then always: a part of
    what they allow)."""
    members = _spliced(c, schema["allOf"], 0)
    found = [i for i, m in enumerate(members) if isinstance(m, dict) and "if" in m]
    if not found or len(found) > MAX_CONDITIONS:
        return None
    i = found[0]
    member = members[i]
    rest = {k: v for k, v in member.items() if k not in ("if", "then", "else")}
    at = f"{pointer}/allOf/{i}"
    try:
        holds = _holding(c, member["if"], rest, f"{at}/if")
        fails = _without(c, member["if"], rest, f"{at}/if")
    except InvalidInput as exc:
        if exc.reason != "SCHEMA_UNSUPPORTED":
            raise
        return None
    options = [
        {**schema, "allOf": [*members[:i], {"allOf": [b, member.get(branch, True)]}, *members[i + 1 :]]}
        for branch, bases in (("then", holds), ("else", fails))
        for b in bases
    ]
    if len(options) > MAX_CONDITION_BRANCHES:
        return None
    return _all_compiling(c, [[(option, pointer)] for option in options], pointer)


def _spliced(c: Combining, members: Any, depth: int) -> list[Any]:
    """allOf members with a member that is a $ref or an allOf alone replaced by its members."""
    if not isinstance(members, list):
        return [members]
    out: list[Any] = []
    for member in members:
        seen = c.in_view(member)
        if (
            depth < 4
            and isinstance(seen, dict)
            and isinstance(seen.get("allOf"), list)
            and {k for k in seen if k in ASSERTIONS} == {"allOf"}
        ):
            out += _spliced(c, seen["allOf"], depth + 1)
        else:
            out.append(seen if seen is not member and isinstance(seen, dict) and "if" in seen else member)
    return out


def _holding(c: Subschemas, condition: Any, base: dict[str, Any], pointer: str) -> list[dict[str, Any]]:
    """`base` and `condition` as alternatives: a condition `not X` as `base` without X, any other
    as the two merged."""
    shape = {k: v for k, v in condition.items() if k in ASSERTIONS} if isinstance(condition, dict) else None
    if shape is not None and set(shape) == {"not"}:
        return _without(c, shape["not"], base, pointer)
    return [{"allOf": [base, condition]}]


def _all_compiling(c: Subschemas, options: list[list[tuple[Any, str]]], pointer: str) -> Node | None:
    """The alternatives (each members of an allOf, or one schema) if every one compiles; None
    where one is refused as unsupported (the caller's coarser reading then)."""
    try:
        return alt(
            *(c.merged(option, pointer) if len(option) > 1 else c.node(*option[0]) for option in options)
        )
    except InvalidInput as exc:
        if exc.reason != "SCHEMA_UNSUPPORTED":
            raise
        return None


def _compiling(c: Subschemas, options: list[list[tuple[Any, str]]], pointer: str) -> Node:
    """The alternatives (each members of an allOf, or one schema) that compile; none: the first
    refusal."""
    nodes, refusal = [], None
    for option in options:
        try:
            nodes.append(c.merged(option, pointer) if len(option) > 1 else c.node(*option[0]))
        except InvalidInput as exc:
            if exc.reason != "SCHEMA_UNSUPPORTED":
                raise
            refusal = refusal or exc
    if not nodes and refusal is not None:
        raise refusal
    return alt(*nodes)


def exactly(
    c: Subschemas, base: dict[str, Any], conditions: list[tuple[Any, Any, Any, str]], pointer: str
) -> Node | None:
    """The conditions, with those of base's allOf members that hold only if/then/else, written
    exactly (_discriminated) on an object schema; None where they cannot be."""
    members = base.get("allOf")
    if isinstance(members, list):
        pure = [
            i
            for i, m in enumerate(members)
            if isinstance(m, dict)
            and "if" in m
            and not {k for k in m if k in ASSERTIONS} - {"if", "then", "else"}
        ]
        conditions = conditions + [
            (
                members[i]["if"],
                members[i].get("then", True),
                members[i].get("else", True),
                f"{pointer}/allOf/{i}",
            )
            for i in pure
        ]
        left = [m for i, m in enumerate(members) if i not in pure]
        base = {k: v for k, v in base.items() if k != "allOf"} | ({"allOf": left} if left else {})
    if base.get("type") not in ("object", ["object"]) or not conditions:
        return None
    try:
        return _discriminated(c, base, conditions, pointer)
    except InvalidInput as exc:
        if exc.reason != "SCHEMA_UNSUPPORTED":
            raise
        return None


def _discriminated(
    c: Subschemas, base: dict[str, Any], conditions: list[tuple[Any, Any, Any, str]], pointer: str
) -> Node | None:
    """if/then/else conditions (if, then, else, pointer) that all test one property's value
    against a const or enum (`{"properties": {"kind": {"const": "a"}}}`, with or without
    `"required": ["kind"]`), written exactly: one alternative per value named (the thens of
    the conditions it meets, the elses of the others), one for every other value (the elses)
    and one for the property absent (an if without `required` holds there: its then). None
    where the conditions are not of that form (_conditional's approximation then)."""
    tested: list[tuple[set[str], bool, Any, Any, str]] = []
    name = None
    for condition, then, otherwise, at in conditions:
        found = kw.tested(condition)
        if found is None or name is not None and found[0] != name:
            return None
        name = found[0]
        tested.append(({kw.json_key(v) for v in found[1]}, found[2], then, otherwise, at))
    if name is None:
        return None
    values: dict[str, Any] = {}
    for condition, *_ in conditions:
        values.update((kw.json_key(v), v) for v in kw.tested(condition)[1])  # type: ignore[index]
    branches: list[list[tuple[Any, str]]] = []
    for key, value in values.items():
        kept = [(t, f"{at}/then") if key in keys else (e, f"{at}/else") for keys, _, t, e, at in tested]
        branches.append([({"properties": {name: {"const": value}}, "required": [name]}, pointer), *kept])
    others = {"properties": {name: {EXCLUDED: list(values.values())}}, "required": [name]}
    branches.append([(others, pointer), *((e, f"{at}/else") for _, _, _, e, at in tested)])
    absent = {"properties": {name: False}}
    branches.append(
        [
            (absent, pointer),
            *((e, f"{at}/else") if needed else (t, f"{at}/then") for _, needed, t, e, at in tested),
        ]
    )
    return alt(*(c.merged([(base, pointer), *branch], pointer) for branch in branches))


def _without(c: Subschemas, negated: Any, base: dict[str, Any], pointer: str) -> list[dict[str, Any]]:
    """`base` and `not: negated` as alternatives (none: nothing can meet both), for the forms
    `lowered` names."""
    if isinstance(negated, bool):
        return [] if negated else [base]
    if "$ref" in base or "allOf" in base:  # the properties a $ref or allOf brings, in view
        flat = c.flattened(base, pointer, 0)
        if flat is None:
            return []
        base = {**{k: v for k, v in base.items() if k not in ASSERTIONS}, **flat}
    if isinstance(negated, dict) and ("$ref" in negated or "allOf" in negated):  # what it brings, in view
        try:
            flat = c.flattened(negated, pointer, 0)
        except InvalidInput as exc:  # a $ref that recurses: its not is not written
            if exc.reason != "CONSTRAINT_TOO_LARGE":
                raise
            raise unsupported(pointer, "'not' of a recursive $ref") from exc
        if flat is None:  # it admits nothing: its not, everything
            return [base]
        negated = flat
    shape = {k: v for k, v in negated.items() if k in ASSERTIONS} if isinstance(negated, dict) else None
    if shape == {}:  # not of any value
        return []
    if shape is not None and set(shape) == {"not"}:  # not of not: the schema itself
        return [{"allOf": [base, shape["not"]]}]
    if shape is not None and set(shape) <= {"enum", "const"}:  # values ruled out ($excluded)
        values = [shape["const"]] if "const" in shape else shape["enum"]
        if not isinstance(values, list):
            raise invalid(f"{pointer}/enum", "enum must be a list")
        if "const" in shape and "enum" in shape:  # both: the const, if the enum holds it
            values = [
                v
                for v in values
                if isinstance(shape["enum"], list)
                and kw.json_key(v) in {kw.json_key(e) for e in shape["enum"]}
            ]
        return [{**base, EXCLUDED: [*base.get(EXCLUDED, []), *values]}]
    if shape is not None and set(shape) == {"pattern"}:  # every non-string meets a pattern: strings only
        if not {"string", "any"} & set(c.types(base, pointer)):
            return []
        return [{**base, "type": "string", UNMATCHED: [*base.get(UNMATCHED, []), shape["pattern"]]}]
    if shape is not None and set(shape) == {"items"} and isinstance(shape["items"], dict | bool):
        # Every non-array meets `items`: arrays only, holding an item that does not meet it.
        if not {"array", "any"} & set(c.types(base, pointer)) or shape["items"] is True:
            return []
        if "contains" in base:
            raise unsupported(pointer, "'not' of 'items' beside 'contains'")
        return [{**base, "type": "array", "contains": {"not": shape["items"]}}]
    if shape is not None and set(shape) == {"contains"} and isinstance(shape["contains"], dict | bool):
        # Every non-array meets `contains`: arrays only, none of whose items meets it.
        if not {"array", "any"} & set(c.types(base, pointer)):
            return []
        return [{"allOf": [{**base, "type": "array"}, {"items": {"not": shape["contains"]}}]}]
    if shape is not None and set(shape) == {"properties"} and isinstance(shape["properties"], dict):
        return _without_properties(c, shape["properties"], base, pointer)
    if shape is not None and set(shape) == {"allOf"} and _all_required(shape["allOf"]):
        shape = {"required": [n for m in shape["allOf"] for n in m["required"]]}  # one list of them all
    if shape is not None and set(shape) == {"type"}:
        types = c.types(base, pointer)
        types = list(TYPE_KEYWORDS) if types == ["any"] else types
        out = shape["type"] if isinstance(shape["type"], list) else [shape["type"]]
        if "integer" in out and "number" not in out and "number" in types:
            raise unsupported(f"{pointer}/type", "'not' of 'integer' beside 'number'")
        left = [t for t in types if t not in out and not (t == "integer" and "number" in out)]
        return [{**base, "type": left}] if left else []
    lists = [shape["required"]] if shape is not None and set(shape) == {"required"} else None
    if shape is not None and set(shape) == {"anyOf"} and isinstance(shape["anyOf"], list):
        members = [m for m in shape["anyOf"] if isinstance(m, dict)]
        if all(set(k for k in m if k in ASSERTIONS) == {"required"} for m in members):
            lists = [m["required"] for m in members]
    if lists is None or not all(isinstance(names, list) and names for names in lists):
        raise unsupported(pointer, "'not' other than of 'required' lists or of 'type'")
    properties = dict(base.get("properties", {}))
    required = base.get("required", [])
    if not properties and not required or base.get("patternProperties"):
        raise unsupported(pointer, "'not' of 'required' on a map or beside 'patternProperties'")
    choices = []
    for names in lists:
        free = [n for n in names if n not in required]
        if not free:
            return []  # every name required: no object meets both
        choices.append(list(dict.fromkeys(free)))
    combos = list(itertools.islice(itertools.product(*choices), MAX_NOT_BRANCHES + 1))
    if len(combos) > MAX_NOT_BRANCHES:  # too many: the last name of each list, a part of what it allows
        combos = [tuple(free[-1] for free in choices)]
    # A name left out is declared never written: not as another member either.
    return [{**base, "properties": {**properties, **dict.fromkeys(combo, False)}} for combo in combos]


def _without_properties(
    c: Subschemas, negated: dict[str, Any], base: dict[str, Any], pointer: str
) -> list[dict[str, Any]]:
    """`base` and not `properties`: an object holding one of those names with a value its schema
    there rejects, an alternative per name (`not` of the value written as `lowered` writes it);
    every non-object meets `properties`, so objects only."""
    if not {"object", "any"} & set(c.types(base, pointer)):
        return []
    own = base.get("properties", {})
    options = []
    for name, schema in negated.items():
        if schema is True or schema == {} or own.get(name) is False:
            continue  # every value meets it, or the name is never written
        if own.get(name) is None and base.get("additionalProperties") is False:
            continue
        inner = {"not": schema} if own.get(name) is None else {"allOf": [own[name], {"not": schema}]}
        options.append(
            {
                **base,
                "type": "object",
                "required": [*base.get("required", []), name],
                "properties": {**own, name: inner},
            }
        )
    return options


def _all_required(members: Any) -> bool:
    """Whether an allOf's members are each a `required` list alone."""
    return isinstance(members, list) and all(
        isinstance(m, dict)
        and {k for k in m if k in ASSERTIONS} == {"required"}
        and isinstance(m["required"], list)
        for m in members
    )
