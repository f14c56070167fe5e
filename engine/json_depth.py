"""How deep JSON text nests, measured on its bytes before any parser sees them.

json.loads recurses once per level, so text nested thousands deep exhausts the stack
(RecursionError) before it can be refused. `check_json_depth` refuses it first, in one linear
pass at C speed (4 MiB of brackets: ~50 ms): strings cut out, then the brackets outside them counted.
"""

from __future__ import annotations

import re

import numpy as np

from engine.errors import InvalidInput

MAX_JSON_DEPTH = 64  # request bodies and JSON schemas: far beyond any real one
# A JSON string, escapes included (the unrolled form: one pass, no backtracking).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = np.zeros(256, dtype=np.int32)
_STEP[list(b"[{")], _STEP[list(b"]}")] = 1, -1


def json_depth(text: str | bytes) -> int:
    """The deepest nesting of arrays and objects in `text` (0 for a scalar); text that is not JSON
    gets a number too, for the parser to refuse it after."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    return max(0, int(np.cumsum(_STEP[np.frombuffer(brackets, dtype=np.uint8)]).max()))


def check_json_depth(text: str | bytes, limit: int = MAX_JSON_DEPTH, field: str = "") -> None:
    """Raise InvalidInput (JSON_TOO_DEEP) when `text` nests deeper than `limit` levels."""
    if json_depth(text) > limit:
        raise InvalidInput(
            f"the JSON nests deeper than the limit of {limit} levels", reason="JSON_TOO_DEEP", field=field
        )
