"""The JSON-Schema-Test-Suite (tests/engine/data/json-schema-test-suite) run against Ladder's JSON
Schema constraint: each test group's schema compiled on the synthetic byte-level vocabulary
(tests/support/vocabularies.py) within SECONDS of CPU time, each instance written the way the
output policy writes JSON and walked through the compiled constraint one byte token at a time
(the row protocol a served request uses), then ended.

Shared by tests/engine/test_json_schema_suite.py (which asserts) and bench/schema_suite_table.py
(which counts). How an instance is written (engine/constrain/json_values.py's whitespace policy):

- compact (`{"a":1,"b":[1,2]}`), and with one space after every `:` and `,` (`{"a": 1, "b": [1, 2]}`);
  strings as json.dumps writes them without ASCII escapes (as the engine writes an enum's);
- an object's members in the schema's declared order first (declared_order: the properties a
  $ref, allOf or anyOf/oneOf member brings, the schema's own, those of then/else/if and dependent
  schemas, then names only required; undeclared members last, in the instance's order), then in
  every other order (up to MAX_MEMBERS members): which declared order the engine keeps depends
  on the branch its merges take, and an invalid instance must be rejected in any order;
- a number as json.dumps writes it, and a whole one also as the other form (`-2` and `-2.0` are
  one number: the engine writes the form an enum or an integer allows), a fraction also without
  an exponent (`1.5e-05` as `0.000015`).

A valid instance counts as accepted when some writing is accepted in each spacing; an invalid one
as rejected when every writing (at most MAX_WRITINGS per spacing) is.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from engine.constrain import compile_constraint
from engine.constrain.budget import Budget
from engine.constrain.compiled import Compiled
from engine.constrain.json_keywords import ASSERTIONS
from engine.errors import InvalidInput
from tests.support.vocabularies import EOS, VOCAB

SUITE = Path(__file__).parents[1] / "engine" / "data" / "json-schema-test-suite"
DRAFTS = ("draft2020-12", "draft7")
FORMATS = "optional/format/*.json"  # of the formats the engine enforces (draft2020-12's, vendored)
SECONDS = 2.0  # CPU allowance of one compile
REFUSALS = ("SCHEMA_UNSUPPORTED", "CONSTRAINT_TOO_LARGE", "CONSTRAINT_UNSATISFIABLE", "SCHEMA_INVALID")
MAX_VARIANTS = 16  # writings of one member or item
MAX_MEMBERS = 5  # an object of more members is written in its declared order alone
MAX_WRITINGS = 256  # writings of one instance per spacing
# Every keyword of drafts 7 to 2020-12 a refusal may name: the assertions, and the keywords that
# name or hold subschemas.
KEYWORDS = ASSERTIONS | frozenset(
    {
        "$anchor",
        "$dynamicAnchor",
        "$id",
        "$defs",
        "definitions",
    }
)


@dataclass(frozen=True, eq=False)  # hashed by identity: cases() makes each once
class Case:
    """One test group of the suite: a schema and its instances."""

    draft: str
    file: str  # the file's path in its draft, less .json: the keyword it tests, mostly
    index: int
    description: str
    schema: Any
    tests: tuple[tuple[str, Any, bool], ...]  # (description, instance, valid)

    @property
    def id(self) -> str:
        return f"{self.draft}/{self.file}/{self.index}"


@functools.cache
def cases() -> tuple[Case, ...]:
    found = []
    for draft in DRAFTS:
        for path in [*sorted((SUITE / draft).glob("*.json")), *sorted((SUITE / draft).glob(FORMATS))]:
            name = path.relative_to(SUITE / draft).with_suffix("").as_posix()  # optional/format/date
            for index, group in enumerate(json.loads(path.read_text())):
                tests = tuple((t["description"], t["data"], t["valid"]) for t in group["tests"])
                found.append(Case(draft, name, index, group["description"], group["schema"], tests))
    return tuple(found)


@dataclass(frozen=True)
class Compiledcase:
    compiled: Compiled | None
    refusal: InvalidInput | None
    cpu_s: float


def compiled(case: Case) -> Compiledcase:
    """The case's schema compiled within SECONDS of CPU time, or its refusal. Cached by the schema
    less its `$schema` (an annotation to the engine): draft7 and draft2020-12 share most schemas,
    and a schema the drafts share is compiled once, as its first group (draft2020-12's) writes it."""
    key = json.dumps(
        {k: v for k, v in case.schema.items() if k != "$schema"}
        if isinstance(case.schema, dict)
        else case.schema,
        sort_keys=True,
    )
    return _compile(_first.setdefault(key, json.dumps(case.schema)))


_first: dict[str, str] = {}  # a schema less its $schema -> the text compiled for it


@functools.cache
def _compile(source: str) -> Compiledcase:
    budget = Budget(SECONDS)
    budget.start()
    started = time.thread_time()
    try:
        result = compile_constraint("json_schema", source, VOCAB, budget=budget)
    except InvalidInput as exc:
        return Compiledcase(None, exc, time.thread_time() - started)
    return Compiledcase(result, None, time.thread_time() - started)


def names_keyword(refusal: InvalidInput) -> bool:
    """Whether a refusal's message names a keyword: its JSON pointer's last part, or one quoted."""
    message = str(refusal)
    pointer = message.split(":", 1)[0]
    parts = {p.replace("~1", "/").replace("~0", "~") for p in pointer.split("/")}
    quoted = set(re.findall(r"'([^']+)'", message))
    return bool((parts | quoted) & KEYWORDS)


def walks(constraint: Compiled, data: bytes) -> bool:
    """Whether the constraint lets `data` be written, one byte token after another, then ended."""
    row = constraint.start()
    for byte in data:
        if not row.allowed()[byte]:
            return False
        row.advance(byte)
    return bool(row.allowed()[EOS]) and row.accepts


# What an instance is and how it is written


def _subschemas(schema: Any, root: Any, seen: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """`schema` and every schema whose keywords join it on one instance, in the order the engine
    merges their properties: $ref targets, allOf, anyOf/oneOf members, the schema itself, then
    then/else/if and dependent schemas."""
    if not isinstance(schema, dict):
        return []
    before: list[dict[str, Any]] = []
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#") and ref not in seen:
        target = _resolve(root, ref)
        before += _subschemas(target, root, seen | {ref})
    for key in ("allOf", "anyOf", "oneOf"):
        for member in schema.get(key, []) if isinstance(schema.get(key), list) else []:
            before += _subschemas(member, root, seen)
    after: list[dict[str, Any]] = []
    for key in ("then", "else", "if"):
        after += _subschemas(schema.get(key), root, seen)
    for key in ("dependentSchemas", "dependencies"):
        for dependent in (schema.get(key) or {}).values() if isinstance(schema.get(key), dict) else []:
            after += _subschemas(dependent, root, seen)
    return [*before, schema, *after]


def _resolve(root: Any, ref: str) -> Any:
    found = root
    for part in ref[1:].split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(found, dict) and part in found:
            found = found[part]
        elif isinstance(found, list) and part.isdigit() and int(part) < len(found):
            found = found[int(part)]
        else:
            return None
    return found


def declared_order(schemas: list[dict[str, Any]]) -> list[str]:
    """The names the schemas declare, as the engine writes them: properties, then required names."""
    names: list[str] = []
    for schema in schemas:
        properties = schema.get("properties")
        names += list(properties) if isinstance(properties, dict) else []
    for schema in schemas:
        required = schema.get("required")
        names += [r for r in required if isinstance(r, str)] if isinstance(required, list) else []
    for schema in schemas:  # draft 7's dependencies and dependentRequired: names required with others
        for key in ("dependentRequired", "dependencies"):
            value = schema.get(key)
            for dependent in value.values() if isinstance(value, dict) else []:
                names += [d for d in dependent if isinstance(d, str)] if isinstance(dependent, list) else []
    return list(dict.fromkeys(names))


def _member_schemas(schemas: list[dict[str, Any]], name: str, root: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for schema in schemas:
        properties = schema.get("properties")
        matched = isinstance(properties, dict) and name in properties
        if matched:
            out += _subschemas(properties[name], root)
        patterns = schema.get("patternProperties")
        for pattern, sub in patterns.items() if isinstance(patterns, dict) else []:
            if _finds(pattern, name):
                out += _subschemas(sub, root)
                matched = True
        if not matched:
            out += _subschemas(schema.get("additionalProperties"), root)
    return out


def _item_schemas(schemas: list[dict[str, Any]], index: int, root: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for schema in schemas:
        prefix = schema.get("prefixItems")
        items = schema.get("items")
        if isinstance(prefix, list) and index < len(prefix):
            out += _subschemas(prefix[index], root)
        elif isinstance(items, list):
            out += _subschemas(items[index] if index < len(items) else schema.get("additionalItems"), root)
        else:
            out += _subschemas(items, root)
        out += _subschemas(schema.get("contains"), root)
    return out


def _finds(pattern: str, name: str) -> bool:
    try:
        return re.search(pattern, name) is not None
    except re.error:
        return False


def arranged(value: Any, schemas: list[dict[str, Any]], root: Any) -> Any:
    """`value` with every object's members in its schema's declared order (others last, as they were)."""
    if isinstance(value, dict):
        order = {name: i for i, name in enumerate(declared_order(schemas))}
        keys = sorted(value, key=lambda k: order.get(k, len(order)))
        return {k: arranged(value[k], _member_schemas(schemas, k, root), root) for k in keys}
    if isinstance(value, list):
        return [arranged(v, _item_schemas(schemas, i, root), root) for i, v in enumerate(value)]
    return value


def _number_forms(value: int | float) -> list[str]:
    first = json.dumps(value)
    forms = [first]
    if isinstance(value, int) and abs(value) < 10**15:
        forms.append(f"{value}.0")
    elif isinstance(value, float) and value.is_integer() and abs(value) < 1e300:
        forms.append(str(int(value)))
    elif isinstance(value, float):
        forms.append(format(Decimal(repr(value)), "f"))
    return list(dict.fromkeys(forms))


def texts(value: Any, space: bool) -> Iterator[str]:
    """The writings of `value`: its members in every order (the order they have first; up to
    MAX_MEMBERS members, else that order alone), its numbers in each form (json.dumps's first)."""
    colon, comma = (": ", ", ") if space else (":", ",")
    if isinstance(value, bool) or value is None:
        yield json.dumps(value)
    elif isinstance(value, int | float):
        yield from _number_forms(value)
    elif isinstance(value, str):
        yield _string(value)
    elif isinstance(value, list):
        items = [list(itertools.islice(texts(v, space), MAX_VARIANTS)) for v in value]
        for parts in itertools.product(*items):
            yield "[" + comma.join(parts) + "]"
    else:
        members = [
            [f"{_string(k)}{colon}{t}" for t in itertools.islice(texts(v, space), MAX_VARIANTS)]
            for k, v in value.items()
        ]
        orders = itertools.permutations(members) if len(members) <= MAX_MEMBERS else iter([members])
        for order in orders:
            for parts in itertools.product(*order):
                yield "{" + comma.join(parts) + "}"


def _string(value: str) -> str:
    try:
        written = json.dumps(value, ensure_ascii=False)
        written.encode("utf-8")
        return written
    except UnicodeEncodeError:  # a lone surrogate: its escape
        return json.dumps(value)


def writings(case: Case, instance: Any) -> list[list[bytes]]:
    """Per spacing (compact, spaced): the instance's writings, the declared order first, at most
    MAX_WRITINGS of them."""
    value = arranged(instance, _subschemas(case.schema, case.schema), case.schema)
    return [
        [t.encode("utf-8") for t in itertools.islice(texts(value, space), MAX_WRITINGS)]
        for space in (False, True)
    ]


def outcome(case: Case, constraint: Compiled, instance: Any, valid: bool) -> bool:
    """Whether the constraint does as the suite says: a valid instance accepted (in some writing)
    in both spacings, an invalid one rejected in every writing."""
    found = [any(walks(constraint, data) for data in spacing) for spacing in writings(case, instance)]
    return all(found) if valid else not any(found)
