"""docs/api.md's reason table (Status codes, Error details) is the server's: every ErrorInfo reason the
code can emit is a row with the status code it comes with, and every row is a reason the code emits.

The reasons are read from the source, not listed here: each `reason="..."` literal a call in service/
or engine/ passes (the status code is the raised class's in service.errors.STATUS_TABLE; a helper
that builds the error is followed to its return annotation), each `reason` parameter's default, each
class's reason in service.errors.REASONS, and the reason of an error nothing explains. So a new
reason cannot ship undocumented.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

from service import errors

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*(ROOT / "service").rglob("*.py"), *(ROOT / "engine").rglob("*.py")])
API = ROOT / "docs" / "api.md"
CODES = {kind.__name__: code.name for kind, code in errors.STATUS_TABLE}
REASON = re.compile(r"[A-Z][A-Z0-9_]+")


def _name(node: ast.expr | None) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value  # a string annotation
    return ""


def emitted_reasons() -> dict[str, set[str]]:
    """reason -> the status codes it is emitted with, from the source and service.errors' tables."""
    found: dict[str, set[str]] = defaultdict(set)
    for kind, reason in errors.REASONS:
        found[reason].add(CODES[kind.__name__])
    fallback = errors.status_for(RuntimeError("nothing explains this"))
    found[fallback.reason].add(fallback.code.name)
    for path in SOURCES:
        tree = ast.parse(path.read_text(), str(path))
        # A helper that builds an error (`def _invalid(...) -> InvalidInput`) stands for its class.
        returns = {
            node.name: _name(node.returns)
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                callee = _name(node.func)
                # A call the scan cannot place counts as code "?", which no table row has.
                code = CODES.get(callee) or CODES.get(returns.get(callee, ""), "?")
                for keyword in node.keywords:
                    value = keyword.value
                    if (
                        keyword.arg == "reason"
                        and isinstance(value, ast.Constant)
                        and isinstance(value.value, str)
                        and REASON.fullmatch(value.value)
                    ):
                        found[value.value].add(code)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _name(node.returns) in CODES:
                positional = node.args.args[len(node.args.args) - len(node.args.defaults) :]
                pairs = [
                    *zip(positional, node.args.defaults, strict=True),
                    *zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True),
                ]
                for argument, default in pairs:
                    if argument.arg == "reason" and isinstance(default, ast.Constant) and default.value:
                        found[str(default.value)].add(CODES[_name(node.returns)])
    return dict(found)


def documented_reasons() -> dict[str, set[str]]:
    """reason -> status codes, from the table whose header is `| code | reason | case | ...`: a row
    with an empty code cell has the code of the row above; a reason cell may name several."""
    lines = API.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| code | reason |"))
    table: dict[str, set[str]] = defaultdict(set)
    code = ""
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        code = cells[0].strip("`") or code
        for reason in re.findall(r"`([A-Z][A-Z0-9_]+)`", cells[1]):
            table[reason].add(code)
    return dict(table)


def test_the_source_scan_finds_the_reasons_of_every_kind_of_site() -> None:
    emitted = emitted_reasons()
    assert emitted["TOKEN_OUT_OF_VOCABULARY"] == {"INVALID_ARGUMENT"}  # a literal at a raise
    assert emitted["GRAMMAR_INVALID"] == {"INVALID_ARGUMENT"}  # a helper's default
    assert emitted["MAX_NEW_TOKENS_OVER_LIMIT"] == {"OUT_OF_RANGE"}  # another class's literal
    assert emitted["CALLER_QUOTA"] == {"RESOURCE_EXHAUSTED"}  # a class's reason in REASONS
    assert emitted["INTERNAL"] == {"INTERNAL"}  # an error nothing explains
    assert len(emitted) > 40


def test_every_reason_the_server_can_emit_is_in_the_api_docs_with_its_status_code() -> None:
    documented = documented_reasons()
    missing = {reason: codes for reason, codes in emitted_reasons().items() if reason not in documented}
    assert not missing, f"reasons the server emits that docs/api.md's reason table lacks: {missing}"
    wrong = {
        reason: (codes, documented[reason])
        for reason, codes in emitted_reasons().items()
        if codes != documented[reason]
    }
    assert not wrong, f"reasons whose status code (emitted, documented) differs: {wrong}"


def test_every_reason_not_written_out_passes_on_one_that_is() -> None:
    """A reason the scan cannot read (not a literal) only hands on one read elsewhere: a refusal
    remembered by the constraint cache, and the GBNF parser's helper passing on its own argument."""
    passed_on = set()
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and _name(node.func) in CODES:
                passed_on |= {
                    (path.relative_to(ROOT).as_posix(), ast.unparse(k.value))
                    for k in node.keywords
                    if k.arg == "reason" and not isinstance(k.value, ast.Constant)
                }
    assert passed_on == {("engine/constrain/cache.py", "self.reason"), ("engine/constrain/gbnf.py", "reason")}


def test_the_api_docs_list_no_reason_the_server_cannot_emit() -> None:
    stale = set(documented_reasons()) - set(emitted_reasons())
    assert not stale, f"docs/api.md's reason table names reasons nothing emits: {sorted(stale)}"
