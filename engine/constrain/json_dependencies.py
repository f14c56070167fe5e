"""JSON Schema's dependencies, dependentRequired and dependentSchemas as the other keywords
(json_lowering.py's `lowered` joins them): each choice of the declared optional properties that
have a dependency, present or absent, as one alternative of `required` and `properties`, with
the dependent schemas to hold beside it."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from engine.constrain import json_keywords as kw
from engine.constrain.json_keywords import ASSERTIONS, MAX_DEPENDENT_CHOICES, invalid, unsupported
from engine.constrain.json_parts import Subschemas
from engine.constrain.pattern import NOTHING, Node, Rules


def dependent(
    c: Subschemas, value: Any, base: dict[str, Any], pointer: str
) -> list[tuple[dict[str, Any], list[tuple[Any, str]]]]:
    """Alternatives of `base` with the dependencies' names required and the dependent schemas
    to hold. The declared optional properties with a dependency: each choice of those present
    (the rest absent) whose present names' dependency lists name none absent, one alternative
    each (exact), up to MAX_DEPENDENT_CHOICES; past them (`_one_choice`) a part of what they
    allow. A dependency on a name written undeclared (a map's key, a key a pattern finds) is
    refused."""
    if not isinstance(value, dict):
        raise invalid(pointer, "dependencies must be an object")
    if "$ref" in base or "allOf" in base:  # the properties a $ref or allOf brings, in view
        flat = c.flattened(base, pointer, 0)
        if flat is None:
            return [(base, [])]
        base = {**{k: v for k, v in base.items() if k not in ASSERTIONS}, **flat}
    given = set(base.get("required", []))
    optional = [
        name
        for name, dependent in value.items()
        if name in base.get("properties", {})
        and name not in given
        and not (dependent is True or dependent == [] or dependent == {})
    ]
    kept = _as_sets(optional, value, base)
    if kept is not None:  # exact for any number of them: the members keep the set written
        rest = {name: dependent for name, dependent in value.items() if name not in optional}
        chosen = {**base, kw.DEPENDS: [*base.get(kw.DEPENDS, []), *kept]}
        return [_dependent_of(c, rest, chosen, pointer)]
    choices = list(itertools.islice(_choices(optional, value), MAX_DEPENDENT_CHOICES + 1))
    if len(choices) > MAX_DEPENDENT_CHOICES:
        choices = [_one_choice(optional, value)]
    options = []
    for present in choices:
        chosen = dict(base)
        chosen["required"] = [*base.get("required", []), *(n for n in optional if n in present)]
        chosen["properties"] = {
            **base.get("properties", {}),
            **{n: False for n in optional if n not in present},
        }
        options.append(_dependent_of(c, value, chosen, pointer))
    return options


def _as_sets(optional: list[str], value: dict[str, Any], base: dict[str, Any]) -> list[Any] | None:
    """The optional names' dependencies as [name, [names, ...]] (kw.DEPENDS: where the name is
    written, all of one of those lists are too), where each is a list of names, `required`, or an
    anyOf of `required` lists, naming declared properties only, in an object of declared
    properties (no patternProperties, no propertyNames); else None. Such rules only ask for more
    members, so every set written can still be completed."""
    properties = base.get("properties", {})
    if not optional or base.get("patternProperties") or "propertyNames" in base:
        return None
    kept = []
    for name in optional:
        lists = _required_lists(value[name])
        if lists is None or any(n not in properties for names in lists for n in names):
            return None
        kept.append([name, lists])
    return kept


def _required_lists(dependent: Any) -> list[list[str]] | None:
    """A dependency as the name lists one of which must be present: a list of names, a schema of
    `required` alone, or of an anyOf of such schemas; None for anything else."""
    if isinstance(dependent, list):
        return [dependent] if all(isinstance(n, str) for n in dependent) else None
    if not isinstance(dependent, dict):
        return None
    asserted = {k for k in dependent if k in ASSERTIONS}
    if asserted == {"required"} and isinstance(dependent["required"], list):
        names = dependent["required"]
        return [names] if all(isinstance(n, str) for n in names) else None
    if asserted == {"anyOf"} and isinstance(dependent["anyOf"], list) and dependent["anyOf"]:
        found = [_required_lists(member) for member in dependent["anyOf"]]
        if any(f is None or len(f) != 1 for f in found):
            return None
        return [f[0] for f in found if f]
    return None


def _choices(optional: list[str], value: dict[str, Any]) -> Iterator[frozenset[str]]:
    """The sets of `optional` names present whose dependency lists name no optional name absent,
    present ones first (lazily: the caller stops at its bound)."""

    def needs(name: str) -> set[str]:
        dependent = value[name]
        return {d for d in dependent if d in optional} if isinstance(dependent, list) else set()

    def grow(i: int, present: frozenset[str], absent: frozenset[str]) -> Iterator[frozenset[str]]:
        if i == len(optional):
            yield present
            return
        name = optional[i]
        if name not in absent and not needs(name) & absent:
            yield from grow(i + 1, present | {name}, absent)
        if name not in present and not any(name in needs(p) for p in present):
            yield from grow(i + 1, present, absent | {name})

    yield from grow(0, frozenset(), frozenset())


def _one_choice(optional: list[str], value: dict[str, Any]) -> frozenset[str]:
    """One choice for too many: a name with a list dependency present (its names required) unless
    the list names a name absent; a name with a dependent schema absent (the schema moot)."""
    present = {n for n in optional if isinstance(value[n], list)}
    while True:
        dropped = {n for n in present if any(d in optional and d not in present for d in value[n])}
        if not dropped:
            return frozenset(present)
        present -= dropped


def _dependent_of(
    c: Subschemas, value: dict[str, Any], base: dict[str, Any], pointer: str
) -> tuple[dict[str, Any], list[tuple[Any, str]]]:
    required = list(base.get("required", []))
    declared = {*base.get("properties", {}), *required}
    schemas = []
    properties = dict(base.get("properties", {}))
    # An undeclared name is written as a key a pattern finds, or as a map's key (no pattern and
    # nothing declared): a dependency on it cannot be kept (it may be written without its dependents).
    patterns = base.get("patternProperties") or {}
    objects = {"object", "any"} & set(c.types(base, pointer))
    for name, dependent in value.items():
        if dependent is True or dependent == [] or dependent == {} or properties.get(name) is False:
            continue  # nothing asked, or the name is never written: its dependency holds
        if objects and name not in declared:
            if any(kw.finds(p, name) for p in patterns) if patterns else not declared:
                raise unsupported(
                    f"{pointer}/{kw.escape(name)}",
                    "a dependency on a name an object may "
                    "hold undeclared (a map's key, or a key patternProperties finds)",
                )
            properties[name] = False  # declared never written: not as another member either
        elif isinstance(dependent, list):
            if name in declared:
                required += [d for d in dependent if isinstance(d, str)]
        elif name in required:  # present in every output: its dependent schema holds
            schemas.append((dependent, f"{pointer}/{kw.escape(name)}"))
        elif name in properties:  # optional: left out (never written), its dependent schema moot
            properties[name] = False
    merged = dict(base)
    if required:
        merged["required"] = list(dict.fromkeys(required))
    if properties:
        merged["properties"] = properties
    return merged, schemas


def set_rules(
    depends: Any, named: dict[str, Node], required: list[str], pointer: str
) -> tuple[dict[str, Node], Rules]:
    """Dependencies kept as sets (kw.DEPENDS: where a name is written, all of one of its lists
    are too) as Members.rules over `named`'s order. A name that can never be written (NOTHING,
    or every list of its names one that can never be written, or one naming a name not declared:
    written as another member, it is not kept in the set) is left out of `named` (a required
    one: nothing fits), so the rules count only members that stay."""
    if not depends:
        return named, ()
    if any(name not in named for name, _ in depends):
        raise unsupported(f"{pointer}/dependencies", "a dependency on a name the object does not declare")
    never = {name for name, node in named.items() if node == NOTHING}
    never |= {n for _, lists in depends for names in lists for n in names if n not in named}
    changed = True
    while changed:
        changed = False
        for name, lists in depends:
            if name not in never and all(set(names) & never for names in lists):
                never.add(name)
                changed = True
    if never & set(required):
        return {name: NOTHING for name in named}, ()
    kept = {name: node for name, node in named.items() if name not in never}
    index = {name: i for i, name in enumerate(kept)}
    rules = tuple(
        (
            index[name],
            tuple(sum(1 << index[n] for n in set(names)) for names in lists if not set(names) & never),
        )
        for name, lists in depends
        if name in index
    )
    return kept, rules
