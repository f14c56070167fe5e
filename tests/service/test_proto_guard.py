"""buf guards the .proto (proto/buf.yaml, scripts/proto-check): it lints clean, keeps every field of the
released API (proto/buf_baseline.binpb), and a change that would break old clients fails the check."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROTO = ROOT / "proto"


@pytest.fixture(scope="module")
def buf() -> str:
    found = Path(sys.executable).parent / "buf"
    if not found.exists():
        pytest.skip("no buf beside this interpreter: pip install -e '.[dev]' (buf-bin)")
    return str(found)


def run_buf(buf: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([buf, *args], capture_output=True, text=True, cwd=cwd, timeout=120, check=False)


def test_the_proto_passes_buf_lint_with_the_written_down_exceptions(buf: str) -> None:
    done = run_buf(buf, "lint", "proto")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_proto_keeps_everything_the_released_api_has(buf: str) -> None:
    done = run_buf(buf, "breaking", "proto", "--against", "proto/buf_baseline.binpb")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("before", "after", "complaint"),
    [
        (
            "  uint32 max_new_tokens = 1;",
            "  uint32 max_new_tokens = 9;",
            'Previously present field "1" with name "max_new_tokens" '
            'on message "StoppingOptions" was deleted.',
        ),
        (
            "  uint32 max_new_tokens = 1;",
            "  uint32 max_tokens = 1;",
            'Field "1" on message "StoppingOptions" changed name from "max_new_tokens" to "max_tokens".',
        ),
        (
            "  rpc Rewind(RewindRequest) returns (RewindResponse);\n",
            "",
            'Previously present RPC "Rewind" on service "Ladder" was deleted.',
        ),
    ],
    ids=["renumbered", "renamed", "rpc-removed"],
)
def test_a_change_that_breaks_old_clients_fails_buf_breaking(
    buf: str, tmp_path: Path, before: str, after: str, complaint: str
) -> None:
    scratch = tmp_path / "proto"
    shutil.copytree(PROTO, scratch, ignore=shutil.ignore_patterns("*.py", "*.pyi", "__pycache__"))
    proto = scratch / "ladder" / "v1" / "ladder.proto"
    text = proto.read_text()
    assert text.count(before) == 1
    proto.write_text(text.replace(before, after))
    done = run_buf(buf, "breaking", "proto", "--against", str(PROTO / "buf_baseline.binpb"), cwd=tmp_path)
    assert done.returncode != 0
    assert complaint in done.stdout, done.stdout + done.stderr
