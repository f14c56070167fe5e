"""The JSON-Schema-Test-Suite against the JSON Schema constraint, per file (issue 41): how many of a
file's schemas compile, how many are refused and why, how many valid instances the compiled ones
accept and how many invalid ones they reject, as tests/engine/test_json_schema_suite.py runs them
(tests/support/schema_suite.py: the synthetic byte-level vocabulary, 2 s of CPU per compile, each
instance written as the output policy writes JSON). Markdown, for docs/api.md:

    python -m bench.schema_suite_table                 # draft2020-12 per file, draft7 summed
    python -m bench.schema_suite_table --per-file draft7
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.schema_suite import DRAFTS, SUITE, Case, cases, compiled, outcome

REASONS = {
    "SCHEMA_UNSUPPORTED": "unsupported",
    "CONSTRAINT_TOO_LARGE": "too large",
    "CONSTRAINT_UNSATISFIABLE": "unsatisfiable",
    "SCHEMA_INVALID": "invalid",
}


@dataclass
class Row:
    groups: int = 0
    compiled: int = 0
    refused: collections.Counter[str] = field(default_factory=collections.Counter)
    valid: int = 0  # valid instances of every group
    valid_compiled: int = 0  # ... of the compiled groups
    accepted: int = 0
    invalid_compiled: int = 0
    rejected: int = 0

    def add(self, case: Case) -> None:
        result = compiled(case)
        self.groups += 1
        self.valid += sum(valid for _, _, valid in case.tests)
        if result.compiled is None:
            assert result.refusal is not None
            self.refused[result.refusal.reason] += 1
            return
        self.compiled += 1
        for _, instance, valid in case.tests:
            ok = outcome(case, result.compiled, instance, valid)
            if valid:
                self.valid_compiled += 1
                self.accepted += ok
            else:
                self.invalid_compiled += 1
                self.rejected += ok

    def cells(self, name: str) -> str:
        refused = ", ".join(f"{n} {REASONS[r]}" for r, n in sorted(self.refused.items())) or "–"
        return (
            f"| {name} | {self.groups} | {self.compiled} | {refused} | "
            f"{self.accepted}/{self.valid_compiled} | {self.rejected}/{self.invalid_compiled} | "
            f"{self.accepted}/{self.valid} |"
        )


HEADER = (
    "| file | schemas | compiled | refused | valid accepted (compiled) | invalid rejected (compiled) "
    "| valid accepted (all) |\n| --- | ---: | ---: | --- | ---: | ---: | ---: |"
)


def rows(draft: str) -> dict[str, Row]:
    found: dict[str, Row] = collections.defaultdict(Row)
    for case in cases():
        if case.draft == draft:
            found[case.file].add(case)
    return dict(found)


def total(found: dict[str, Row]) -> Row:
    out = Row()
    for row in found.values():
        out.groups += row.groups
        out.compiled += row.compiled
        out.refused += row.refused
        for name in ("valid", "valid_compiled", "accepted", "invalid_compiled", "rejected"):
            setattr(out, name, getattr(out, name) + getattr(row, name))
    return out


SUFFIX = " is not supported in JSON schema constraints"
KINDS = [  # refusals of one kind, whatever their reference or property
    (r"^the reference '[^#'][^']*'.*", "a reference that is not local (#/...)"),
    (r"^the reference '#[^/'][^']*'.*", "a reference to a plain-name fragment (#name: an $anchor or $id)"),
    (r"'[^']*', a property another", "'…', a property another"),
]


def refusals(draft: str) -> collections.Counter[str]:
    """The refusals' messages without their pointers (a non-local $ref counted as one kind)."""
    found: collections.Counter[str] = collections.Counter()
    for case in cases():
        refusal = compiled(case).refusal
        if case.draft == draft and refusal is not None:
            message = str(refusal).split(": ", 1)[-1].removesuffix(SUFFIX)
            for pattern, kind in KINDS:
                message = re.sub(pattern, kind, message)
            found[f"{REASONS[refusal.reason]}: {message}"] += 1
    return found


def commit() -> str:
    readme = (SUITE / "README.md").read_text()
    found = re.search(r"`([0-9a-f]{40})`", readme)
    return found.group(1)[:12] if found else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--per-file",
        action="append",
        choices=DRAFTS,
        help="a draft to show file by file (default: draft2020-12; the others summed)",
    )
    args = parser.parse_args()
    per_file = args.per_file or ["draft2020-12"]
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent
    ).stdout.strip()
    print(f"JSON-Schema-Test-Suite {commit()}, Ladder {head or '?'}\n")
    print(HEADER)
    for draft in DRAFTS:
        found = rows(draft)
        if draft in per_file:
            for name, row in sorted(found.items()):
                print(row.cells(name))
        print(total(found).cells(f"**{draft}, all {len(found)} files**"))
    for draft in per_file:
        print(f"\nRefused in {draft} (schemas):\n")
        for message, n in refusals(draft).most_common():
            print(f"- {n} × {message}")


if __name__ == "__main__":
    main()
