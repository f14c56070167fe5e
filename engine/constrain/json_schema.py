"""JSON Schema as a syntax tree (pattern.py) whose every output parses as JSON and validates, or
InvalidInput naming the keyword at fault: never a silently unconstrained run. The compiler here
walks subschemas, $refs (a recursive one is a `Ref`: the pushdown engine), types, enum/const and
combinators. Its rooms: json_one_of.py (oneOf as exactly one member), json_objects.py,
json_arrays.py, json_scalars.py (numbers, strings), json_lowering.py (if/then/else, not),
json_dependencies.py (dependencies), json_keywords.py (keywords, allOf's merge), json_values.py
(how JSON is written), json_drafts.py (draft 3-7's reading), json_parts.py (what the rooms ask of
the compiler).
What is written and what is refused, for users: docs/api.md "JSON Schema"."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from engine.constrain import json_arrays as arrays
from engine.constrain import json_keywords as kw
from engine.constrain import json_lowering as lowering
from engine.constrain import json_objects as objects
from engine.constrain import json_scalars as scalars
from engine.constrain import json_values as jv
from engine.constrain import machines as mx
from engine.constrain import nfa
from engine.constrain.budget import UNBOUNDED, Budget
from engine.constrain.json_drafts import as_named_draft
from engine.constrain.json_keywords import (
    ASSERTIONS,
    COMBINATORS,
    EXCLUDED,
    FIELD,
    INTERNAL,
    KNOWN,
    LOWERED,
    MERGED,
    OPEN,
    OWN_FIRST,
    TYPE_KEYWORDS,
    UNMATCHED,
    invalid,
    unsupported,
)
from engine.constrain.json_one_of import OneOf
from engine.constrain.limits import DEFAULT_LIMITS, Limits
from engine.constrain.pattern import NOTHING, Node, Ref, alt, seq
from engine.errors import InvalidInput
from engine.json_depth import check_json_depth


@dataclass(frozen=True)
class Tree:
    """A schema's syntax tree and the rules its `Ref` nodes name (none: a DFA can run it)."""

    root: Node
    rules: dict[str, Node]


def tree(
    source: str, limits: Limits = DEFAULT_LIMITS, budget: Budget = UNBOUNDED, *, strict: bool = False
) -> Tree:
    """The schema's tree. A recursive $ref is a `Ref` to the rule of its target, and an open value
    (any JSON value, at any depth) a `Ref` to the rule OPEN.
    `strict`: the reading of OpenAI's strict mode, where an object with declared properties and
    no additionalProperties holds no others (the spec's reading allows any others)."""
    # Refused before json.loads recurses per level; a schema level nests JSON two deep at most, so the
    # compiler's own max_schema_depth (CONSTRAINT_TOO_LARGE) still answers any schema nested less.
    check_json_depth(source, 4 * limits.max_schema_depth, field=FIELD)
    try:
        root = json.loads(source, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(
            f"the JSON schema is not valid JSON: {exc}", reason="SCHEMA_INVALID", field=FIELD
        ) from exc
    root = as_named_draft(root)
    compiler = _Compiler(root, limits, budget, strict)
    return Tree(compiler.node(root, ""), compiler.rules)


class _Compiler:
    def __init__(self, root: Any, limits: Limits, budget: Budget, strict: bool) -> None:
        self.root = root
        self.strict = strict
        self.limits = limits
        self.budget = budget
        self.entered: dict[str, int] = {}  # $ref -> times entered on the current path (merged ones)
        self.nodes = 0  # subschemas compiled so far
        self.targets: dict[str, Node] = {}  # a $ref's target compiled: once per schema
        self.on_path: set[str] = set()  # $ref targets being compiled (a $ref to one recurses)
        self.rules: dict[str, Node] = {}  # the targets a recursive $ref refers to
        self.one_of = OneOf(self)  # oneOf's members kept apart, and the steps that may take

    def open_value(self) -> Node:
        """Any JSON value, at any depth: the rule OPEN."""
        if OPEN not in self.rules:
            self.rules[OPEN] = jv.any_value(Ref(OPEN))
        return Ref(OPEN)

    def node(self, schema: Any, pointer: str) -> Node:
        self._count(pointer)
        if pointer.count("/") > self.limits.max_schema_depth:
            raise InvalidInput(
                f"{pointer}: the schema nests deeper than {self.limits.max_schema_depth}",
                reason="CONSTRAINT_TOO_LARGE",
                field=FIELD,
            )
        if isinstance(schema, bool):
            return self.open_value() if schema else NOTHING
        if not isinstance(schema, dict):
            raise invalid(pointer, "a schema must be an object or a boolean")
        if LOWERED & schema.keys():
            return lowering.lowered(self, schema, pointer)
        for key in schema:
            if key in ASSERTIONS and key not in KNOWN:
                raise unsupported(f"{pointer}/{kw.escape(key)}", f"the keyword {key!r}")
        for key in COMBINATORS:
            if key in schema:
                return self._combinator(key, schema, pointer)
        if "enum" in schema or "const" in schema:
            return self._values(schema, pointer)
        return alt(*(self._typed(t, schema, pointer) for t in self.types(schema, pointer)))

    def _count(self, pointer: str) -> None:
        """One more subschema: within the limit and the compile's budget (a leaf may cost ~1 ms)."""
        self.budget.check()
        self.nodes += 1
        if self.nodes > self.limits.max_schema_nodes:
            raise InvalidInput(
                f"{pointer or '/'}: the schema expands to more than "
                f"{self.limits.max_schema_nodes} subschemas ($refs counted each time "
                "they are entered)",
                reason="CONSTRAINT_TOO_LARGE",
                field=FIELD,
            )

    def _combinator(self, key: str, schema: dict[str, Any], pointer: str) -> Node:
        """A combinator; assertion keywords beside it hold too: beside allOf they are one more
        member, beside $ref the two are merged as an allOf, beside anyOf/oneOf they join every
        alternative (S and (A or B) is (S and A) or (S and B))."""
        if key == "allOf" or "allOf" in schema:
            return self._all_of(schema, pointer)
        beside = {k: v for k, v in schema.items() if k != key and k in ASSERTIONS}
        value = schema[key]
        if key == "$ref":
            lead = {OWN_FIRST: True} if beside and kw.properties_lead(schema, "$ref") else {}
            return self._ref(value, pointer, {**beside, **lead})
        if not isinstance(value, list) or not value:
            raise invalid(f"{pointer}/{key}", f"{key} must be a non-empty list of schemas")
        parts = []
        for i, member in enumerate(value):
            at = f"{pointer}/{key}/{i}"
            # The keywords beside first: their properties' order leads.
            plain = {"allOf": [member], **beside, OWN_FIRST: True} if beside else member
            others = value[:i] + value[i + 1 :]
            exclusive = self.one_of.exclusive(member, others, plain, beside, at) if key == "oneOf" else None
            if exclusive is not None:
                parts.append(exclusive)
            else:
                parts.append(self._all_of(plain, at) if beside else self.node(member, at))
        return alt(*(self.one_of.exactly_one(value, parts) if key == "oneOf" else parts))

    @contextmanager
    def aside(self, strict: bool) -> Iterator[None]:
        """Compile a part for a question about it, not for the schema's output: read `strict` or
        not, and the $ref targets and rules it compiles not kept for the schema's own use."""
        saved = self.strict, dict(self.targets), dict(self.rules)
        self.strict = strict
        try:
            yield
        finally:
            self.strict, self.targets, self.rules = saved

    def in_view(self, schema: Any) -> Any:
        """A schema as its keywords show it: a local $ref alone, its target."""
        seen = 0
        while isinstance(schema, dict) and set(schema) & ASSERTIONS == {"$ref"} and seen < 8:
            ref = schema["$ref"]
            if not isinstance(ref, str) or not ref.startswith("#"):
                break
            try:
                schema = self.resolve(unquote(ref[1:]), "")
            except InvalidInput:
                break
            seen += 1
        return schema

    def _all_of(self, schema: dict[str, Any], pointer: str, at: list[str] | None = None) -> Node:
        """allOf as one schema: its members (and the keywords beside it, one more member) merged,
        each keyword once. Members that are local $refs are merged as their targets; members of
        if/then/else alone on one property's value, exactly (json_lowering.exactly)."""
        value = schema["allOf"]
        if not isinstance(value, list) or not value:
            raise invalid(f"{pointer}/allOf", "allOf must be a non-empty list of schemas")
        if len(value) == 1 and set(schema) & (ASSERTIONS | INTERNAL) == {"allOf"}:
            return self.node(value[0], f"{pointer}/allOf/0")  # the member itself: a $ref may recurse
        exact = lowering.exactly(self, schema, [], pointer)
        if exact is None:
            exact = lowering.conditions_apart(self, schema, pointer)
        if exact is not None:
            return exact
        beside = {k: v for k, v in schema.items() if k not in ("allOf", OWN_FIRST)}
        members = [(m, at[i] if at else f"{pointer}/allOf/{i}") for i, m in enumerate(value)]
        ordered = (
            [(beside, pointer), *members]
            if kw.properties_lead(schema, "allOf", "$ref")
            else [*members, (beside, pointer)]
        )
        return self.merged(ordered, pointer)

    def merged(self, members: list[tuple[Any, str]], pointer: str) -> Node:
        """The schemas (each with its own pointer) merged into one, as allOf's members are."""
        merged: dict[str, Any] = {}
        for member, at in members:
            try:
                flat = self.flattened(member, at, 0)
                if flat is None:
                    return NOTHING
                kw.merge_into(merged, flat if at == pointer else kw.alone(flat), at)  # at == pointer: its own
            except InvalidInput as exc:  # members with no type in common: this branch admits nothing
                if exc.reason != "CONSTRAINT_UNSATISFIABLE":
                    raise
                return NOTHING
        return self.node(merged, pointer)

    def flattened(self, member: Any, pointer: str, depth: int) -> dict[str, Any] | None:
        """A member's assertion keywords as one dict (None: it admits nothing), a $ref member
        followed and a nested allOf merged in."""
        if isinstance(member, bool):
            return {} if member else None
        if not isinstance(member, dict):
            raise invalid(pointer, "a schema must be an object or a boolean")
        if depth > self.limits.max_ref_depth + self.limits.max_schema_depth:
            raise InvalidInput(
                f"{pointer}: allOf and $ref nest too deep to merge",
                reason="CONSTRAINT_TOO_LARGE",
                field=FIELD,
            )
        self._count(pointer)
        own = {k: v for k, v in member.items() if k in ASSERTIONS or k in INTERNAL}
        own_first = kw.properties_lead(own, "$ref", "allOf")
        own.pop(OWN_FIRST, None)
        merged: dict[str, Any] = {}
        ref = own.pop("$ref", None)
        nested = own.pop("allOf", None)
        parts: list[tuple[Any, str]] = []
        if ref is not None:
            if not isinstance(ref, str) or not ref.startswith("#"):
                raise unsupported(f"{pointer}/$ref", f"the reference {ref!r} (only local ones, #/...)")
            parts.append((self.resolve(unquote(ref[1:]), f"{pointer}/$ref"), unquote(ref[1:])))
        if nested is not None:
            if not isinstance(nested, list) or not nested:
                raise invalid(f"{pointer}/allOf", "allOf must be a non-empty list of schemas")
            parts += [(m, f"{pointer}/allOf/{i}") for i, m in enumerate(nested)]
        if "if" not in own:  # then and else assert nothing without an if
            own.pop("then", None)
            own.pop("else", None)
        if "if" in own and "else" not in own:  # then holds always (json_lowering): merge it
            own.pop("if")
            parts.append((own.pop("then", True), f"{pointer}/then"))
        if own_first:
            kw.merge_into(merged, own, pointer)
        for part, at in parts:
            flat = self.flattened(part, at, depth + 1)
            if flat is None:
                return None
            kw.merge_into(merged, kw.alone(flat), at)
        if not own_first:
            kw.merge_into(merged, own, pointer)
        return merged

    def _ref(self, ref: Any, pointer: str, beside: dict[str, Any] | None = None) -> Node:
        """The target's schema (with `beside`, the keywords next to the $ref: merged with it), each
        target entered at most max_ref_depth times along one path."""
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise unsupported(f"{pointer}/$ref", f"the reference {ref!r} (only local ones, #/...)")
        target = unquote(ref[1:])
        if not beside:
            return self._target(target, pointer)
        if self.entered.get(target, 0) >= self.limits.max_ref_depth:
            return NOTHING
        schema = self.resolve(target, f"{pointer}/$ref")
        self.entered[target] = self.entered.get(target, 0) + 1
        try:
            if beside:
                return self._all_of({"allOf": [schema], **beside}, pointer, [target])
            return self.node(schema, target)
        finally:
            self.entered[target] -= 1

    def _target(self, target: str, pointer: str) -> Node:
        """A $ref alone: its target compiled once; referred to (a `Ref`) where it recurses."""
        found = self.targets.get(target)
        if found is not None:
            return found
        if target in self.on_path:
            self.rules[target] = NOTHING  # filled in once the target is compiled
            return Ref(target)
        schema = self.resolve(target, f"{pointer}/$ref")
        self.on_path.add(target)
        try:
            node = self.node(schema, target)
        finally:
            self.on_path.discard(target)
        if target in self.rules:
            self.rules[target] = node
        self.targets[target] = node
        return node

    def resolve(self, target: str, pointer: str) -> Any:
        if target and not target.startswith("/"):  # "#foo" names an $anchor (or an $id), not a path
            raise unsupported(
                pointer, f"the reference {'#' + target!r} (a plain-name fragment; only JSON pointers, #/...)"
            )
        found = self.root
        for part in target.split("/")[1:] if target else []:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(found, list) and part.isdigit() and int(part) < len(found):
                found = found[int(part)]
            elif isinstance(found, dict) and part in found:
                found = found[part]
            else:
                raise invalid(pointer, f"the reference #{target} points at nothing")
        return found

    def _values(self, schema: dict[str, Any], pointer: str) -> Node:
        key = "const" if "const" in schema else "enum"
        values = [schema["const"]] if key == "const" else schema["enum"]
        if not isinstance(values, list) or not values and not schema.get(MERGED):
            raise invalid(f"{pointer}/enum", "enum must be a non-empty list")
        if key == "const" and "enum" in schema:  # both: the const, if the enum holds it
            if not isinstance(schema["enum"], list):
                raise invalid(f"{pointer}/enum", "enum must be a non-empty list")
            values = [v for v in values if kw.json_key(v) in {kw.json_key(e) for e in schema["enum"]}]
        types = self.types(schema, pointer) if "type" in schema else list(TYPE_KEYWORDS)
        excluded = {kw.json_key(v) for v in schema.get(EXCLUDED, [])}
        values = [
            v for v in values if any(kw.is_type(v, t) for t in types) and kw.json_key(v) not in excluded
        ]
        others = [k for k in schema if k not in ("const", "enum", "type", *INTERNAL) and k in ASSERTIONS]
        if others and values:
            values = self._values_meeting(values, {k: schema[k] for k in others}, key, pointer)
        return alt(*(jv.literal(v) for v in values))

    def _values_meeting(self, values: list[Any], rest: dict[str, Any], key: str, pointer: str) -> list[Any]:
        """The enum's (const's) values the schema's other keywords admit: each walked, compact,
        through their automaton, read strictly (an object in its own member order and without
        undeclared members: one the rest admits otherwise is left out, never an output the schema
        rejects). Keywords whose automaton cannot be built here (recursion, an open value, past
        the state limit) are refused, naming the first."""
        first = next(iter(rest))
        refusal = unsupported(f"{pointer}/{kw.escape(first)}", f"{first!r} beside {key!r}")
        kinds = {next(t for t in TYPE_KEYWORDS if t != "integer" and kw.is_type(v, t)) for v in values}
        with self.aside(strict=True):  # no undeclared members: no open value (a part, as above)
            node = self.node({**rest, "type": sorted(kinds)}, pointer)  # the values' types only
        if mx.refers(node):
            raise refusal
        try:
            admits = mx.matcher(node, self.budget)
        except nfa.TooLarge:
            raise refusal from None
        return [v for v in values if admits(_compact(v))]

    def types(self, schema: dict[str, Any], pointer: str) -> list[str]:
        declared = schema.get("type")
        if declared is None:  # every type; the keywords of one hold for its values only
            keyed = any(set(keys) & set(schema) for keys in TYPE_KEYWORDS.values())
            return [t for t in TYPE_KEYWORDS if t != "integer"] if keyed else ["any"]
        names = [declared] if isinstance(declared, str) else declared
        if not isinstance(names, list) or not names or any(n not in TYPE_KEYWORDS for n in names):
            raise invalid(f"{pointer}/type", f"unknown type {declared!r}")
        return list(dict.fromkeys(names))

    def _typed(self, name: str, schema: dict[str, Any], pointer: str) -> Node:
        excluded = [v for v in schema.get(EXCLUDED, []) if kw.is_type(v, name if name != "any" else "string")]
        if excluded or name == "any" and EXCLUDED in schema:
            return self._excluding(name, schema, schema[EXCLUDED], pointer)
        if name == "any":
            return self.open_value()
        if name == "object":
            return objects.compiled(self, schema, pointer)
        if name == "array":
            return arrays.compiled(self, schema, pointer)
        if name == "string":
            return scalars.string(schema, pointer, self.budget)
        if name == "integer":
            return scalars.multiples(
                jv.integer_range(*kw.integer_bounds(schema, pointer)), schema, pointer, True, self.budget
            )
        if name == "number":
            return scalars.multiples(scalars.number(schema, pointer), schema, pointer, False, self.budget)
        return jv.BOOLEAN if name == "boolean" else jv.NULL

    def _excluding(self, name: str, schema: dict[str, Any], excluded: list[Any], pointer: str) -> Node:
        """Values of type `name` but those `excluded` (a condition's or a `not`'s): booleans and
        null by value; plain strings by their trie (jv.plain_other_than); other strings, integers
        and numbers as automata with the excluded values' writings taken out (strings as
        CANONICAL_STRING writes them, numbers without an exponent); objects and arrays with a
        value to exclude are refused."""
        if name == "any":
            return alt(*(self._typed(t, schema, pointer) for t in TYPE_KEYWORDS if t != "integer"))
        if name == "boolean":
            return alt(*(jv.literal(b) for b in (True, False) if b not in excluded))
        if name == "null":
            return NOTHING
        if name == "string" and not set(TYPE_KEYWORDS["string"]) & set(schema) and UNMATCHED not in schema:
            return seq(jv.QUOTE, jv.plain_other_than([v for v in excluded if isinstance(v, str)]), jv.QUOTE)
        rest = {k: v for k, v in schema.items() if k != EXCLUDED}
        try:
            if name == "string":
                written = scalars.string(rest, pointer, self.budget)
                node = mx.intersection(written, jv.CANONICAL_STRING, self.budget)
                out = [jv.string_literal(v) for v in excluded if isinstance(v, str)]
                return mx.difference(node, alt(*out), self.budget)
            if name in ("integer", "number"):
                whole = name == "integer"
                node = (
                    self._typed(name, rest, pointer)
                    if whole
                    else scalars.multiples(
                        scalars.number(rest, pointer, plain=True), rest, pointer, False, self.budget
                    )
                )
                out = [jv.decimal_literal(v) for v in excluded if kw.is_type(v, name)]
                return mx.difference(node, alt(*out), self.budget)
        except nfa.TooLarge as exc:
            raise unsupported(pointer, f"values ruled out of a {name} here ({exc})") from exc
        raise unsupported(
            pointer,
            f"a condition ('if') or 'not' ruling out {name} values (only strings, "
            "numbers, booleans and null)",
        )


def _compact(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
