"""oneOf as exactly one of its members: members its own keywords show disjoint need nothing; one
that may overlap another requiring names leaves one of those names out (`exclusive`); the rest are
each less the others as automata (`exactly_one`), within a count of steps; else anyOf's reading."""

from __future__ import annotations

import json
from typing import Any

from engine.constrain import json_keywords as kw
from engine.constrain import machines as mx
from engine.constrain import nfa
from engine.constrain.budget import OverBudget, Steps
from engine.constrain.json_disjoint import disjoint
from engine.constrain.json_keywords import ASSERTIONS, OPEN
from engine.constrain.json_parts import Combining
from engine.constrain.pattern import NOTHING, Alt, Node, Ref, alt
from engine.errors import InvalidInput

ONE_OF_STATES = 4_000  # a oneOf alternative less the others: its DFAs' and the difference's states
ONE_OF_STEPS = 20_000  # states built and walked by all of a compile's oneOf differences (~0.2 s)


class OneOf:
    """A compile's oneOf writer: what it asks of the compile (Combining) and the steps left to its
    automata differences (ONE_OF_STEPS for the whole compile)."""

    def __init__(self, c: Combining) -> None:
        self.c = c
        self.steps_left = ONE_OF_STEPS

    def exactly_one(self, members: list[Any], parts: list[Node]) -> list[Node]:
        """oneOf's alternatives as exactly one member: each alternative's values less the other
        alternatives' values of the same JSON type (where disjoint cannot tell the members
        apart), as automata within ONE_OF_STATES states and ONE_OF_STEPS in all; parts holding
        an open value or recursion, and past those bounds: as they are (anyOf's reading: a value
        two members meet is admitted). No value only one member meets is lost; a value two meet
        stays where they write it differently (`3.0` against an integer's `3`), or where
        `exclusive` wrote the other without it."""
        views = [self.c.in_view(m) for m in members]
        seen: dict[str, int] = {}
        for i, view in enumerate(views):  # a member twice: what meets it meets two, so none does
            same = "true" if view is True or view == {} else json.dumps(view, sort_keys=True)
            if seen.setdefault(same, i) != i:
                if same == "true":
                    return [NOTHING] * len(parts)
                parts[i] = parts[seen[same]] = NOTHING
        split = [[(item, mx.first_bytes(item)) for item in self._alternatives(part)] for part in parts]
        exact = []
        for i, part in enumerate(parts):
            others = [
                pair
                for j in range(len(members))
                if j != i and not disjoint(views[i], views[j])
                for pair in split[j]
            ]
            kept: list[Node] = []
            cut: list[Node] = []
            near: list[Node] = []
            for item in self._alternatives(part):
                leads = mx.first_bytes(item)
                meets = [
                    o
                    for o, theirs in others
                    if leads is None or theirs is None or not leads.isdisjoint(theirs)
                ]
                if (
                    meets
                    and leads is not None
                    and self.steps_left > 0
                    and not mx.refers(item)
                    and not any(mx.refers(o) for o in meets)
                ):
                    cut.append(item)
                    near.extend(o for o in meets if all(o is not n for n in near))
                else:
                    kept.append(item)  # apart from every other member's value, or anyOf's reading
            if cut:
                fewer = self._difference(alt(*cut), alt(*near))
                kept.extend(cut if fewer is None else [fewer])
            exact.append(alt(*kept))
        return exact

    def exclusive(
        self, member: Any, others: list[Any], plain: Any, beside: dict[str, Any], pointer: str
    ) -> Node | None:
        """A oneOf member and none of the others: each other member it may overlap (neither
        disjoint nor _apart_by_values tells them apart) that requires a name the member does not
        is ruled out by leaving one such name out (`not` of required lists: a part of "not that
        member", never more); nothing where another member is `required` names alone that every
        value of this one holds. None where no other member needs ruling out or it cannot be
        written so (the member alone then: anyOf's reading, which admits a value two members both
        meet)."""
        mine = self.c.in_view(member)
        given = sorted(self._needed(mine) | self._needed(beside))
        lists, deeper = [], []
        for other in others:
            theirs = self.c.in_view(other)
            names = theirs.get("required") if isinstance(theirs, dict) else None
            if not (isinstance(names, list) and names and all(isinstance(n, str) for n in names)):
                continue
            if disjoint(_requiring(mine, given), _requiring(theirs, given)):
                continue
            if self._apart_by_values(mine, theirs, given, pointer):
                continue
            if set(names) - set(given):
                lists.append((names, _value_escapes(theirs)))
            elif {k for k in theirs if k in ASSERTIONS} == {"required"}:
                return NOTHING  # the other holds wherever this member does: never this one alone
            elif (inner := self._required_inside(mine, theirs, names)) is not None:
                deeper.append({"properties": {inner[0]: {"not": {"required": inner[1]}}}})
        if not lists and not deeper:
            return None
        # Exactly "not that member" where it is its required names and its properties' schemas: a
        # name left out, or a property written with a value its schema refuses; else (or where
        # that cannot be compiled) the names alone, stricter than the member's `not`.
        exact = [
            {"anyOf": [{"not": {"required": names}}, *escapes]} if escapes else {"not": {"required": names}}
            for names, escapes in lists
        ]
        stricter = [{"not": {"anyOf": [{"required": names} for names, _ in lists]}}] if lists else []
        for parts in (exact, stricter) if exact != stricter else (stricter,):
            try:
                return self.c.node({"allOf": [plain, *parts, *deeper]}, pointer)
            except InvalidInput as exc:
                if exc.reason != "SCHEMA_UNSUPPORTED":
                    raise
        return None

    def _needed(self, schema: Any, depth: int = 0) -> set[str]:
        """The names every value a schema admits holds: its `required`, every allOf member's, and
        those all of an anyOf's or oneOf's members require (`{"oneOf": [{"required": ["a", "b"]},
        {"required": ["a", "c"]}]}` needs `a`)."""
        schema = self.c.in_view(schema)
        if not isinstance(schema, dict) or depth > 8:
            return set()
        own = schema.get("required")
        names = {n for n in own if isinstance(n, str)} if isinstance(own, list) else set()
        members = schema.get("allOf")
        if isinstance(members, list):
            names.update(*(self._needed(m, depth + 1) for m in members))
        for key in ("anyOf", "oneOf"):
            members = schema.get(key)
            if isinstance(members, list) and members:
                names |= set.intersection(*(self._needed(m, depth + 1) for m in members))
        return names

    def _required_inside(self, mine: Any, theirs: Any, names: list[str]) -> tuple[str, list[str]] | None:
        """A property the other member requires whose object there requires names this member's
        does not (a oneOf whose members differ one level down: `content` with `src` or with
        `background-image`): leaving one of those out of it rules the other member out."""
        own = mine.get("properties") if isinstance(mine, dict) else None
        their_own = theirs.get("properties")
        if not isinstance(their_own, dict):
            return None
        for name in names:
            inner = self.c.in_view(their_own.get(name))
            needed = inner.get("required") if isinstance(inner, dict) else None
            if not (isinstance(needed, list) and needed and all(isinstance(n, str) for n in needed)):
                continue
            ours = self.c.in_view(own.get(name)) if isinstance(own, dict) else None
            have = ours.get("required") if isinstance(ours, dict) else None
            if set(needed) - set(have if isinstance(have, list) else []):
                return name, needed
        return None

    def _apart_by_values(self, first: Any, second: Any, given: list[str], pointer: str) -> bool:
        """Whether a property one of two members requires (or `given` requires) has schemas in the
        two whose values have none in common, as their automata show (a pattern `^success$`
        against `^fail$`); False where they cannot be built as automata. The smallest pairs are
        tried first, in name order among equals, each within ONE_OF_STATES and the compile's
        ONE_OF_STEPS (a set's order and a large pair used to decide whether a compile finished:
        GitHub o48770 took 0.3 s or past its 2 s by the process's string hashing)."""
        if not isinstance(first, dict) or not isinstance(second, dict):
            return False
        own = [s["properties"] if isinstance(s.get("properties"), dict) else {} for s in (first, second)]
        needed = set(given) | {
            n
            for s in (first, second)
            if isinstance(s.get("required"), list)
            for n in s["required"]
            if isinstance(n, str)
        }
        pairs = []
        for name in sorted(set(own[0]) & set(own[1]) & needed):
            at = f"{pointer}/properties/{kw.escape(name)}"
            try:
                with self.c.aside(self.c.strict):
                    one, two = self.c.node(own[0][name], at), self.c.node(own[1][name], at)
            except InvalidInput:
                continue
            if not mx.refers(one) and not mx.refers(two):
                pairs.append((nfa.size(one) + nfa.size(two), name, one, two))
        for _, _, one, two in sorted(pairs, key=lambda pair: pair[:2]):
            if self.steps_left <= 0:
                return False
            allowance = Steps(self.steps_left)
            try:
                if mx.intersection(one, two, allowance, ONE_OF_STATES) == NOTHING:
                    return True
            except (nfa.TooLarge, OverBudget):
                continue
            finally:
                self.steps_left = allowance.left
                self.c.budget.check()
        return False

    def _difference(self, first: Node, second: Node) -> Node | None:
        """`first` less `second` as automata, None past ONE_OF_STATES states or once the compile's
        differences took ONE_OF_STEPS in all (they are worth that much only; steps, not seconds,
        so every machine writes the same oneOf)."""
        if self.steps_left <= 0:
            return None
        allowance = Steps(self.steps_left)
        try:
            return mx.difference(first, second, allowance, ONE_OF_STATES)
        except (nfa.TooLarge, OverBudget):
            return None
        finally:
            self.steps_left = allowance.left
            self.c.budget.check()

    def _alternatives(self, node: Node) -> tuple[Node, ...]:
        """A node's alternatives, an open value's as its rule's (a $ref's rule may be unfinished)."""
        if node == Ref(OPEN):
            node = self.c.rules[OPEN]
        return node.items if isinstance(node, Alt) else (node,)


def _value_escapes(schema: Any) -> list[dict[str, Any]]:
    """Where `schema` asserts only `required` and `properties`, the values that leave it beside its
    names: `not` of its properties (a name written with a value its schema refuses, as the
    lowering writes it); [] otherwise."""
    if not isinstance(schema, dict) or {k for k in schema if k in ASSERTIONS} != {"required", "properties"}:
        return []
    properties = schema["properties"]
    if not isinstance(properties, dict) or all(v is True or v == {} for v in properties.values()):
        return []
    return [{"not": {"properties": properties}}]


def _requiring(schema: Any, names: list[str]) -> Any:
    """A schema with `names` required too (the keywords beside a oneOf hold for each member)."""
    if not isinstance(schema, dict) or not names:
        return schema
    own = schema.get("required")
    return {**schema, "required": [*(own if isinstance(own, list) else []), *names]}
