"""JSON Schema objects as syntax trees: declared properties (in any order), required names,
additionalProperties (the spec reading or the strict one), min/maxProperties, propertyNames and
patternProperties. What they ask of the compile: Compiling."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from engine.constrain import json_keywords as kw
from engine.constrain import json_scalars as scalars
from engine.constrain import json_values as jv
from engine.constrain import machines as mx
from engine.constrain import nfa
from engine.constrain.json_dependencies import set_rules
from engine.constrain.json_keywords import ASSERTIONS, FIELD, invalid, unsupported
from engine.constrain.json_parts import Compiling
from engine.constrain.pattern import NOTHING, Node, Rules, alt, members, repeat, seq, text
from engine.errors import InvalidInput

KEYS_STATES = 4_000  # keys patterns find, split by the patterns that find them (else refused)
MAX_PATTERN_SCHEMAS = 3  # patternProperties' different schemas: their keys split 2**3 - 1 ways


def compiled(c: Compiling, schema: dict[str, Any], pointer: str) -> Node:
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    if not isinstance(properties, dict):
        raise invalid(f"{pointer}/properties", "properties must be an object")
    if not isinstance(required, list) or any(not isinstance(r, str) for r in required):
        raise invalid(f"{pointer}/required", "required must be a list of names")
    # Members no properties/patternProperties keyword evaluates (a map's keys, undeclared required
    # names, others among the declared ones) take additionalProperties' schema (else
    # unevaluatedProperties'); absent, any value, and the strict reading writes no others.
    given = schema.get("additionalProperties", schema.get("unevaluatedProperties"))
    additional = True if given is None else given
    least = kw.count(schema, "minProperties", pointer, 0) or 0
    most = kw.count(schema, "maxProperties", pointer, None)
    names = schema.get("propertyNames")
    if schema.get(kw.DEPENDS) and (names is not None or schema.get("patternProperties") or not properties):
        raise unsupported(f"{pointer}/dependencies", "dependencies beside propertyNames or patternProperties")
    if names is not None:
        if schema.get("patternProperties"):
            raise unsupported(f"{pointer}/propertyNames", "'propertyNames' beside 'patternProperties'")
        properties, required = _named(c, names, properties, required, f"{pointer}/propertyNames")
        if required is None:
            return NOTHING  # a required name propertyNames rules out
    if schema.get("patternProperties"):
        return _patterned(c, schema, properties, required, additional, given is not None, pointer)
    if not properties and not required:
        if least > 1:  # a map's keys are not kept apart: a key written twice would count once
            raise unsupported(f"{pointer}/minProperties", "minProperties above 1 on a map")
        at = f"{pointer}/propertyNames"
        key = None if names is None else c.merged([(names, at), ({"type": "string"}, pointer)], at)
        return _map(c, additional, pointer, least, most, key)
    # What the counts ask must hold for every object made (no others beside maxProperties), or,
    # where every declared property is required, they count the others.
    declared = dict.fromkeys([*properties, *required])
    others = given is not None or not c.strict  # explicit, or the spec's reading of absent
    counted = (
        others
        and additional is not False
        and names is None
        and set(declared) <= set(required)
        and (least > len(declared) or most is not None)
    )
    if counted:
        if most is not None and most < max(least, len(declared)):
            return NOTHING
        least, most = max(least - len(declared), 0), None if most is None else most - len(declared)
        if least > 1:  # as on a map: the others' keys are not kept apart
            raise unsupported(
                f"{pointer}/minProperties",
                "minProperties above the declared properties "
                "and one other (the others' keys are not kept apart)",
            )
    elif least == 1 and not required:
        pass  # not empty: one member at least (_one_at_least)
    elif least > len(set(required)):
        raise unsupported(
            f"{pointer}/minProperties",
            "minProperties above the number of required "
            "properties (an object of declared properties may leave the others out)",
        )
    if not counted and most is not None and most < len(declared):
        raise unsupported(f"{pointer}/maxProperties", "maxProperties below the number of declared properties")
    named = {
        name: _member(c, name, subschema, f"{pointer}/properties/{kw.escape(name)}")
        for name, subschema in properties.items()
    }
    # A required name not among properties takes additionalProperties' schema (false: none fits).
    named.update(
        {
            name: _member(c, name, additional, f"{pointer}/additionalProperties")
            for name in dict.fromkeys(required)
            if name not in properties
        }
    )
    named, rules = set_rules(schema.get(kw.DEPENDS), named, required, pointer)
    anywhere: list[Node] = []  # other members, written any number of times among the declared
    tail = []  # members after the declared ones (their count counted)
    if others and additional is not False and names is None and (counted or most is None):
        # Others anywhere among the declared ones, keys spelling no declared name (jv.other_than).
        key = seq(jv.QUOTE, jv.other_than(list(declared)), jv.QUOTE)
        other = seq(key, jv.COLON, c.node(additional, f"{pointer}/additionalProperties"))
        if not counted:
            anywhere.append(other)
        elif most != 0:
            tail.append((repeat(other, max(least, 1), most, jv.COMMA), least > 0))
    declared_items = [(node, name in required) for name, node in named.items()]
    nonempty = least == 1 and not required and not counted
    return _object(declared_items, anywhere, tail, nonempty, rules)


def _object(
    declared: list[tuple[Node, bool]],
    others: list[Node],
    rest: list[tuple[Node, bool]],
    nonempty: bool,
    rules: Rules = (),
) -> Node:
    """The declared members in any order (each at most once) and the `others` (members whose keys
    no declared name spells) any number of times anywhere among them, as JSON Schema reads an
    object; then the `rest` (others whose count is counted) in order. `nonempty`: one member at
    least, declared or other. `rules`: the dependencies, over the declared members."""
    others = [other for other in others if other != NOTHING]  # rules count the items: none drops out
    rest = [(item, needed) for item, needed in rest if item != NOTHING or needed]
    items = [*declared, *((other, False) for other in others), *rest]
    free = len(declared) + len(others)
    if not nonempty:
        return seq(text("{"), members(items, jv.COMMA, free, again=len(others), rules=rules), text("}"))
    some_free = members(items, jv.COMMA, free, least=True, again=len(others), rules=rules)
    only_rest = members(_one_at_least(rest), jv.COMMA) if rest else NOTHING
    return alt(*(seq(text("{"), part, text("}")) for part in (some_free, only_rest)))


def _one_at_least(items: list[tuple[Node, bool]]) -> list[tuple[Node, bool]]:
    """Optional members of which one at least is written: the first written is one of them, the
    ones after it as they were (minProperties 1 where nothing is required)."""
    first = alt(*(members([(item, True), *items[i + 1 :]], jv.COMMA) for i, (item, _) in enumerate(items)))
    return [(first, True)]


def _patterned(
    c: Compiling,
    schema: dict[str, Any],
    properties: dict[str, Any],
    required: list[str],
    additional: Any,
    explicit: bool,
    pointer: str,
) -> Node:
    """An object with patternProperties: its declared properties as any object's (a declared
    name patterns also find with their schemas too, merged, and written once), then any number of
    members whose keys a pattern finds, with the schemas of every pattern that finds them (keys
    split by which patterns find them: up to MAX_PATTERN_SCHEMAS different schemas, as automata
    within KEYS_STATES states), then (where others are allowed, as for declared objects) members
    whose plain keys no pattern finds, with additionalProperties' schema: the keys' automata's
    difference (past its state limit, none written)."""
    at = f"{pointer}/patternProperties"
    patterns = schema["patternProperties"]
    if not isinstance(patterns, dict):
        raise invalid(at, "patternProperties must be an object")
    if "maxProperties" in schema:
        raise unsupported(f"{pointer}/maxProperties", "'maxProperties' beside 'patternProperties'")
    least = kw.count(schema, "minProperties", pointer, 0) or 0
    nonempty = least == 1 and not required  # one member at least (_one_at_least)
    if least > len(set(required)) and not nonempty:
        raise unsupported(
            f"{pointer}/minProperties",
            "'minProperties' beside 'patternProperties' above "
            "the required count and 1 (the keys patterns find are not kept apart)",
        )
    finding = {
        source: seq(jv.QUOTE, scalars.regex_found(source, f"{at}/{kw.escape(source)}"), jv.QUOTE)
        for source in patterns
    }
    groups: dict[str, list[str]] = {}  # the patterns of each schema
    for source, value in patterns.items():
        groups.setdefault(json.dumps(value, sort_keys=True), []).append(source)
    if len(groups) > MAX_PATTERN_SCHEMAS:
        raise unsupported(at, f"patterns of more than {MAX_PATTERN_SCHEMAS} different schemas")
    sources = list(groups.values())
    schemas = [(patterns[group[0]], f"{at}/{kw.escape(group[0])}") for group in sources]

    def finders(name: str) -> list[tuple[Any, str]]:
        return [schemas[i] for i, group in enumerate(sources) if any(kw.finds(s, name) for s in group)]

    found = {name: finders(name) for name in dict.fromkeys([*properties, *required]) if finders(name)}
    # Declared with a schema of its own beside the patterns': written as declared only.
    both = [
        name
        for name in found
        if name in properties
        and [json.dumps(properties[name], sort_keys=True)]
        != [json.dumps(v, sort_keys=True) for v, _ in found[name]]
    ]
    items: list[tuple[Node, bool]] = []
    for name, subschema in properties.items():
        own = f"{pointer}/properties/{kw.escape(name)}"
        if name in both:  # every schema holds
            items.append(
                (
                    seq(jv.literal(name), jv.COLON, c.merged([(subschema, own), *found[name]], own)),
                    name in required,
                )
            )
        else:
            items.append((_member(c, name, subschema, own), name in required))
    for name in dict.fromkeys(required):
        if name not in properties:
            value = (
                _all_of(c, found[name])
                if name in found
                else c.node(additional, f"{pointer}/additionalProperties")
            )
            items.append((seq(jv.literal(name), jv.COLON, value), True))
    keys = [alt(*(finding[s] for s in group)) for group in sources]
    try:
        # A declared (or required) name a pattern finds is written as declared only: one parse, so
        # the patterns' members may come anywhere among the declared ones.
        keyed, anywhere = _key_classes(c, keys, list(found)), True
    except nfa.TooLarge:
        try:  # those names left in (an automaton too large without them): the members after them
            keyed, anywhere = _key_classes(c, keys, both), False
        except nfa.TooLarge as exc:
            raise unsupported(
                at,
                "patterns whose keys, split by the patterns that find them, "
                f"pass the automata's limit ({exc})",
            ) from exc
    member = alt(*(seq(k, jv.COLON, _all_of(c, [schemas[i] for i in inside])) for k, inside in keyed))
    others = [member] if anywhere else []
    rest = [] if anywhere else [(repeat(member, 1, None, jv.COMMA), False)]
    if additional is not False and (explicit or not c.strict):
        # Then others: keys that no pattern finds and no declared name spells.
        declared = list(dict.fromkeys([*properties, *required]))
        plain = seq(jv.QUOTE, jv.other_than(declared), jv.QUOTE)
        try:
            unfound = mx.difference(plain, alt(*finding.values()), c.budget)
        except nfa.TooLarge:
            unfound = NOTHING  # as under the strict reading: no others written
        if unfound != NOTHING:
            other = seq(unfound, jv.COLON, c.node(additional, f"{pointer}/additionalProperties"))
            others.append(other)
    return _object(items, others, rest, nonempty)


def _key_classes(c: Compiling, keys: list[Node], left_out: list[str]) -> list[tuple[Node, list[int]]]:
    """The keys each set of patterns' groups finds and no other group does (one group: its keys),
    less the names `left_out`; nfa.TooLarge past KEYS_STATES states."""
    if left_out:
        names = alt(*(jv.literal(name) for name in left_out))
        keys = [mx.difference(k, names, c.budget, KEYS_STATES) for k in keys]
    if len(keys) == 1:
        return [(keys[0], [0])]
    classes = []
    for chosen in range(1, 1 << len(keys)):
        inside = [i for i in range(len(keys)) if chosen >> i & 1]
        node = keys[inside[0]]
        for i in inside[1:]:
            node = mx.intersection(node, keys[i], c.budget, KEYS_STATES)
        outside = [keys[j] for j in range(len(keys)) if not chosen >> j & 1]
        if outside and node != NOTHING:
            node = mx.difference(node, alt(*outside), c.budget, KEYS_STATES)
        if node != NOTHING:
            classes.append((node, inside))
    return classes


def _all_of(c: Compiling, schemas: list[tuple[Any, str]]) -> Node:
    return c.node(*schemas[0]) if len(schemas) == 1 else c.merged(schemas, schemas[0][1])


def _member(c: Compiling, name: str, schema: Any, pointer: str) -> Node:
    return seq(jv.literal(name), jv.COLON, c.node(schema, pointer))


def _map(
    c: Compiling,
    additional: Any,
    pointer: str,
    least: int = 0,
    most: int | None = None,
    key: Node | None = None,
) -> Node:
    if additional is False:
        return text("{}") if least == 0 else NOTHING
    return jv.object_map(c.node(additional, f"{pointer}/additionalProperties"), least, most, key)


def _named(
    c: Compiling, names: Any, properties: dict[str, Any], required: list[str], pointer: str
) -> tuple[dict[str, Any], list[str] | None]:
    """The declared properties propertyNames leaves (one it rules out is never written) and the
    required names (None: one of them is ruled out, so nothing fits)."""
    kept = dict(properties)
    for name in dict.fromkeys([*properties, *required]):
        if not _name_fits(c, names, name, pointer, 0):
            if name in required:
                return kept, None
            kept[name] = False
    return kept, required


def _name_fits(c: Compiling, names: Any, name: str, pointer: str, depth: int) -> bool:
    """Whether a property name meets a propertyNames schema: its string keywords, enum, const,
    local $refs and allOf; anything else is refused."""
    if isinstance(names, bool):
        return names
    if not isinstance(names, dict):
        raise invalid(pointer, "a schema must be an object or a boolean")
    if depth > c.limits.max_ref_depth + c.limits.max_schema_depth:
        raise InvalidInput(
            f"{pointer}: propertyNames' $refs nest too deep", reason="CONSTRAINT_TOO_LARGE", field=FIELD
        )
    checks: dict[str, Callable[[Any], bool]] = {
        "type": lambda v: v == "string" or isinstance(v, list) and "string" in v,
        "pattern": lambda v: kw.search(v, name, f"{pointer}/pattern"),
        "minLength": lambda v: len(name) >= v,
        "maxLength": lambda v: len(name) <= v,
        "enum": lambda v: isinstance(v, list) and name in v,
        "const": lambda v: v == name,
        "format": lambda v: True,  # checked only where the value's format is enforced
    }
    for key, value in names.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            target = c.resolve(unquote(value[1:]), f"{pointer}/$ref")
            if not _name_fits(c, target, name, pointer, depth + 1):
                return False
        elif key == "allOf" and isinstance(value, list):
            if not all(_name_fits(c, m, name, f"{pointer}/allOf", depth + 1) for m in value):
                return False
        elif key in checks:
            if not checks[key](value):
                return False
        elif key in ASSERTIONS:
            raise unsupported(f"{pointer}/{kw.escape(key)}", f"{key!r} in propertyNames")
    return True
