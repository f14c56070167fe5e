"""Building the compiled example clients (clients/{cpp,go,java}/build.sh) for their tests, and reading
what they print.

Each build.sh fetches Debian's packages without root (scripts/debian-fetch.sh) into
.pytest_cache/d/ladder-<name>-deps when the system lacks them, and exits 3 when they cannot be had
(the test is then skipped). A build is cached under .pytest_cache/d/ladder-<name>-client/<key>: the key
hashes its sources, the .proto, the fetch script and the packages' path (a binary's rpath may name it).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".pytest_cache" / "d"
PROTO = ROOT / "proto" / "ladder" / "v1" / "ladder.proto"
DEBIAN_FETCH = ROOT / "scripts" / "debian-fetch.sh"
UNOBTAINABLE = 3  # build.sh's exit status when its packages cannot be had


def deps_dir(name: str) -> Path:
    """Where the client's Debian packages are cached (its build.sh's LADDER_<NAME>_DEPS)."""
    return CACHE / f"ladder-{name}-deps"


def run_build(name: str, *args: str, what: str) -> subprocess.CompletedProcess[str]:
    """clients/<name>/build.sh with `args`, its packages cached here; skips the test when they cannot be
    obtained (`what` names them), else asserts it succeeded."""
    env = {**os.environ, f"LADDER_{name.upper()}_DEPS": str(deps_dir(name))}
    done = subprocess.run(
        [str(ROOT / "clients" / name / "build.sh"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
        check=False,
    )
    if done.returncode == UNOBTAINABLE:
        pytest.skip(f"{what} cannot be obtained here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    return done


def build_dir(name: str, sources: Sequence[Path]) -> Path:
    """The client's build directory for these sources; builds of earlier sources are removed."""
    digest = hashlib.sha256(str(deps_dir(name)).encode())
    for source in [*sources, PROTO, DEBIAN_FETCH]:
        digest.update(source.read_bytes())
    found = CACHE / f"ladder-{name}-client" / digest.hexdigest()[:16]
    for stale in found.parent.glob("*"):
        if stale != found:
            shutil.rmtree(stale, ignore_errors=True)
    return found


def built_client(name: str, sources: Sequence[Path], what: str) -> Path:
    """The path build.sh prints: the client's binary or launcher, built (or cached) for these sources."""
    return Path(run_build(name, str(build_dir(name, sources)), what=what).stdout.strip())


def last_json_line(stderr: str) -> dict[str, object]:
    return json.loads(stderr.strip().splitlines()[-1])  # type: ignore[no-any-return]


def assert_printed_as_the_docs_show(stderr: str, keys: list[str]) -> None:
    """The JSON line is compact, its keys in the order docs/api.md shows (tests/support/docs_examples.py
    renders the page's example with the same json.dumps)."""
    line = stderr.strip().splitlines()[-1]
    assert list(json.loads(line)) == keys
    assert line == json.dumps(json.loads(line), separators=(",", ":"), ensure_ascii=False)
