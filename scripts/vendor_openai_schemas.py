"""Vendor the response schemas of OpenAI's published OpenAPI spec for tests/service/test_openai_schema.py.

Usage: python scripts/vendor_openai_schemas.py OPENAPI_JSON COMMIT > tests/service/openai_openapi/schemas.json

OPENAPI_JSON is openapi.json of the openai/openai-openapi repository (MIT, its LICENSE is copied beside
the vendored file) at COMMIT. Only the response schemas the tests check are kept, with every schema
they reference (the whole spec is ~3 MB), each as published.
"""

from __future__ import annotations

import json
import sys
from typing import Any

ROOTS = ("CreateChatCompletionResponse", "CreateChatCompletionStreamResponse", "CreateCompletionResponse")
PREFIX = "#/components/schemas/"


def referenced(node: Any, schemas: dict[str, Any], found: set[str]) -> None:
    """Add to `found` every schema `node` references, and theirs."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str) and value.startswith(PREFIX):
                name = value.removeprefix(PREFIX)
                if name not in found:
                    found.add(name)
                    referenced(schemas[name], schemas, found)
            else:
                referenced(value, schemas, found)
    elif isinstance(node, list):
        for item in node:
            referenced(item, schemas, found)


def main(path: str, commit: str) -> None:
    with open(path) as file:
        spec = json.load(file)
    schemas = spec["components"]["schemas"]
    found = set(ROOTS)
    for root in ROOTS:
        referenced(schemas[root], schemas, found)
    vendored = {
        "source": "https://github.com/openai/openai-openapi openapi.json",
        "commit": commit,
        "openapi": spec["openapi"],
        "version": spec["info"]["version"],
        "components": {"schemas": {name: schemas[name] for name in sorted(found)}},
    }
    json.dump(vendored, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
