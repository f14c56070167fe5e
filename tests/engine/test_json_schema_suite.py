"""The official JSON-Schema-Test-Suite (draft2020-12 and draft7, and draft2020-12's optional/format
files of the formats Ladder enforces; vendored under tests/engine/data/json-schema-test-suite)
against the JSON Schema constraint, one test per group.

A group's schema either compiles or is refused. A refusal must be one of the documented reasons,
and SCHEMA_UNSUPPORTED must name the keyword at fault. A compiled schema must accept every valid
instance, written as the output policy writes JSON, and reject every invalid one in every
writing (tests/support/schema_suite.py: both spacings, every member order, each number form).
CONSTRAINT_UNSATISFIABLE says nothing fits: the group's valid instances count as rejected.

What the documented policy does not write (a subset of what a schema allows, never an output it
rejects), what it lets through (oneOf written as anyOf; a uri's parts unchecked) and the bugs not
fixed yet ("BUG: ...") are listed in EXCLUDED, each with its reason. The table is kept honest both
ways: a test it names that passes fails too (remove it), and every entry must name some test.

    python -m bench.schema_suite_table   # the per-file table of docs/api.md
"""

from __future__ import annotations

import fnmatch

import pytest

from tests.support.schema_suite import REFUSALS, Case, cases, compiled, names_keyword, outcome, writings

ONE_OF = (
    "policy: oneOf members that may overlap are kept apart by their required lists and, as "
    "automata, by the values each writes (docs/api.md): a value two write differently (3.0 "
    "against an integer's 3), or open values, stay"
)
CONDITIONAL = (
    "policy: if/then/else keep part of what they allow (docs/api.md: then held always "
    "without else; with else, then and else both, or if and then)"
)
ONE_ALTERNATIVE = (
    "policy: an anyOf is written one alternative at a time (docs/api.md), so members "
    "that only two alternatives together evaluate are not written"
)
FORMATS = (
    "policy: date, time, date-time, duration, uuid, email, ipv4, ipv6, hostname, uri, "
    "uri-reference, iri, iri-reference, uri-template and regex are enforced (docs/api.md), not "
    "annotations"
)
REAL_DATES = (
    "policy: February stops at the 28th (the 29th in leap years) and seconds at 59, so every "
    "date and time written is a real one (formats.py)"
)
UPPER_CASE = "policy: date-time and time write `T` and `Z` upper-case (docs/api.md)"
FRACTION = "policy: a time's fraction has at most 9 digits (time is 9–24 characters, docs/api.md)"
EMAIL = "policy: email is dot-atoms @ a hostname, no quoted local part or address literal (docs/api.md)"
HOSTNAME_LENGTH = (
    "BUG: a hostname's total length (253 at most) is not bounded (json_values.py FORMATS; "
    "docs/api.md says so)"
)
A_LABELS = "policy: no hostname label has hyphens 3rd and 4th, so no xn-- A-label is written (docs/api.md)"

EXCLUDED: dict[str, str] = {
    "*/oneOf/0/2": ONE_OF,
    "draft2020-12/unevaluatedProperties/35/20": ONE_OF,
    "*/if-then-else/9/1": CONDITIONAL,
    "draft2020-12/unevaluatedItems/23/[123]": CONDITIONAL,
    "draft2020-12/unevaluatedItems/27/0": CONDITIONAL,
    "draft2020-12/unevaluatedProperties/14/2": CONDITIONAL,
    "draft2020-12/unevaluatedProperties/16/0": CONDITIONAL,
    "draft2020-12/unevaluatedProperties/39/0": CONDITIONAL,
    "draft2020-12/unevaluatedProperties/11/2": ONE_ALTERNATIVE,
    "draft2020-12/format/[02346789]/6": FORMATS,  # email, regex, ipv4, ipv6, hostname, date, date-time, time
    "draft2020-12/format/1[2345678]/6": FORMATS,  # iri(-ref), uri(-ref), uri-template, uuid, duration
    "draft2020-12/optional/format/date-time/0/1[01]": REAL_DATES,
    "draft2020-12/optional/format/time/0/1[0367]": REAL_DATES,
    "draft2020-12/optional/format/time/0/2[01]": REAL_DATES,
    "draft2020-12/optional/format/date-time/0/22": UPPER_CASE,
    "draft2020-12/optional/format/time/0/30": UPPER_CASE,
    "draft2020-12/optional/format/date-time/0/31": FRACTION,
    "draft2020-12/optional/format/email/0/1[12345]": EMAIL,
    "draft2020-12/optional/format/hostname/1/[167]": A_LABELS,
    "draft2020-12/optional/format/hostname/1/1[47]": A_LABELS,
    "draft2020-12/optional/format/hostname/1/2[03678]": A_LABELS,
    "draft2020-12/optional/format/hostname/1/3[01456]": A_LABELS,
    "draft2020-12/optional/format/hostname/0/20": HOSTNAME_LENGTH,
    "draft7/ref/5/1": (
        "policy: keywords beside a $ref are merged with its target (docs/api.md), as "
        "2019-09 on has it; draft 7 ignored them"
    ),
    "draft2020-12/vocabulary/0/2": (
        "policy: $schema is an annotation (docs/api.md): a meta-schema "
        "without the validation vocabulary does not turn validation off"
    ),
}

ALL_EXCLUDED = EXCLUDED

CASES = cases()


def matches(test_id: str, pattern: str) -> bool:
    """fnmatch, one /-separated part at a time (a `*` never spans a `/`)."""
    parts, wanted = test_id.split("/"), pattern.split("/")
    return len(parts) == len(wanted) and all(map(fnmatch.fnmatchcase, parts, wanted))


def excluded(test_id: str) -> str | None:
    return next((reason for pattern, reason in ALL_EXCLUDED.items() if matches(test_id, pattern)), None)


def results(case: Case) -> dict[str, bool]:
    """Each test's id and whether the constraint does as the suite says."""
    result = compiled(case)
    out = {}
    for i, (_, instance, valid) in enumerate(case.tests):
        if result.compiled is not None:
            out[f"{case.id}/{i}"] = outcome(case, result.compiled, instance, valid)
        else:  # refused: nothing is written; only CONSTRAINT_UNSATISFIABLE claims no valid instance exists
            assert result.refusal is not None
            out[f"{case.id}/{i}"] = not valid or result.refusal.reason != "CONSTRAINT_UNSATISFIABLE"
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_each_suite_group_compiles_and_decides_as_the_suite_says_or_is_refused(case: Case) -> None:
    refusal = compiled(case).refusal
    if refusal is not None:
        assert refusal.reason in REFUSALS, str(refusal)
        assert refusal.reason != "SCHEMA_UNSUPPORTED" or names_keyword(refusal), str(refusal)
    found = results(case)
    failed = [
        f"{test_id} ({'valid' if case.tests[int(test_id.rsplit('/', 1)[1])][2] else 'invalid'}: "
        f"{case.tests[int(test_id.rsplit('/', 1)[1])][0]})"
        for test_id, ok in found.items()
        if not ok and excluded(test_id) is None
    ]
    passing = [test_id for test_id, ok in found.items() if ok and excluded(test_id) is not None]
    assert not failed, f"{case.description}: {failed}"
    assert not passing, f"excluded but passing now, remove from the table: {passing}"


def test_every_exclusion_names_a_test_of_the_suite() -> None:
    ids = [f"{c.id}/{i}" for c in CASES for i in range(len(c.tests))]
    assert [p for p in ALL_EXCLUDED if not any(matches(i, p) for i in ids)] == []


def test_the_suite_is_the_vendored_draft2020_12_and_draft7_files() -> None:
    drafts = {c.draft for c in CASES}
    assert drafts == {"draft2020-12", "draft7"} and len(CASES) > 600


def test_instances_are_written_in_declared_order_first_then_in_other_orders_and_number_forms() -> None:
    schema = {"properties": {"b": {}, "a": {}}, "required": ["c"]}
    case = Case("draft2020-12", "example", 0, "", schema, ())
    compact, spaced = writings(case, {"x": [1.5e-05], "a": 1, "c": True, "b": 2.0})
    assert compact[0] == b'{"b":2.0,"a":1,"c":true,"x":[1.5e-05]}'
    assert spaced[0] == b'{"b": 2.0, "a": 1, "c": true, "x": [1.5e-05]}'
    others = {b'{"b":2,"a":1.0,"c":true,"x":[0.000015]}', b'{"x":[1.5e-05],"c":true,"a":1,"b":2.0}'}
    assert others <= set(compact)
