"""Generate the Python stubs of proto/ladder/v1 with grpcio-tools.

Run `python -m proto.generate` after editing a .proto (mypy-protobuf, a dev dependency, types the
service stubs). The stubs are committed;
tests/service/test_proto_stubs.py regenerates them into a temporary directory
and checks they are identical. The package is importable as `proto.ladder.v1`.

Beside the stubs, `<name>_descriptor_set.binpb`: the FileDescriptorSet of each
.proto with its source info (comments and locations), which the compiled-in
descriptors lack; server reflection serves it, so `grpcurl describe` shows the
.proto's documentation (service/grpc/reflection.py).

The grpc stubs carry the grpcio they need (`GRPC_GENERATED_VERSION`), which grpcio-tools stamps
with its own version; a patch release changes nothing else in them. The stamp is written as
pyproject.toml's grpcio floor, so the stubs are the same whichever patch of the pinned minor made
them (CI installs the newest) and ask for no newer grpcio than the project declares.
"""

from __future__ import annotations

import re
import shutil
import sys
import tomllib
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent
PROTOS = ("ladder/v1/ladder.proto",)
# protoc writes absolute imports ("from ladder.v1 import ladder_pb2"); the package lives under proto/.
_ABSOLUTE_IMPORT = re.compile(r"^from ladder\.v1 import (\w+_pb2)", re.MULTILINE)
_GENERATED_VERSION = re.compile(r"^GRPC_GENERATED_VERSION = '([0-9.]+)'$", re.MULTILINE)


def generate(out_dir: Path = ROOT) -> list[Path]:
    """Write *_pb2.py, *_pb2.pyi, *_pb2_grpc.py and *_pb2_grpc.pyi under out_dir; return the files written."""
    include = protoc._get_resource_file_name("grpc_tools", "_proto")
    args = [
        "grpc_tools.protoc",
        f"-I{ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--plugin=protoc-gen-mypy_grpc={_mypy_grpc_plugin()}",
        f"--mypy_grpc_out={out_dir}",
        *PROTOS,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")
    written = []
    for proto in PROTOS:
        descriptors = descriptor_set_path(proto, out_dir)
        args = [
            "grpc_tools.protoc",
            f"-I{ROOT}",
            f"-I{include}",
            "--include_source_info",
            f"--descriptor_set_out={descriptors}",
            proto,
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed: {' '.join(args)}")
        written.append(descriptors)
    for proto in PROTOS:
        stem = out_dir / proto.removesuffix(".proto")
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py", "_pb2_grpc.pyi"):
            path = stem.with_name(stem.name + suffix)
            text = _ABSOLUTE_IMPORT.sub(r"from proto.ladder.v1 import \1", path.read_text())
            path.write_text(_GENERATED_VERSION.sub(_stamp_floor, text))
            written.append(path)
    return written


def grpcio_floor() -> str:
    """The lowest grpcio pyproject.toml allows (`grpcio>=X.Y.Z`)."""
    project = tomllib.loads((ROOT.parent / "pyproject.toml").read_text())["project"]
    for requirement in project["dependencies"]:
        name, _, bounds = requirement.partition(">=")
        if name.strip() == "grpcio":
            return bounds.split(",")[0].strip()
    raise RuntimeError("pyproject.toml declares no grpcio>= floor")


def _stamp_floor(match: re.Match[str]) -> str:
    """GRPC_GENERATED_VERSION as the grpcio floor, when the generating grpcio-tools is a patch of it."""
    floor, generated = grpcio_floor(), match.group(1)
    if generated.split(".")[:2] != floor.split(".")[:2]:
        raise RuntimeError(
            f"grpcio-tools {generated} generated the stubs, grpcio's floor is {floor}: regenerate with "
            f"grpcio-tools {'.'.join(floor.split('.')[:2])}.*, or raise both bounds in pyproject.toml"
        )
    return f"GRPC_GENERATED_VERSION = '{floor}'"


def _mypy_grpc_plugin() -> Path:
    """mypy-protobuf's protoc plugin (a dev dependency), installed beside this interpreter: it types
    the service stubs (`LadderStub`), which grpcio-tools leaves untyped, so mypy checks the clients' calls."""
    plugin = Path(sys.executable).parent / "protoc-gen-mypy_grpc"
    found = plugin if plugin.exists() else shutil.which("protoc-gen-mypy_grpc")
    if found is None:
        raise RuntimeError("protoc-gen-mypy_grpc not found: pip install -e '.[dev]' (mypy-protobuf)")
    return Path(found)


def descriptor_set_path(proto: str, root: Path = ROOT) -> Path:
    """Where the FileDescriptorSet (with source info) of `proto` is written."""
    return root / (proto.removesuffix(".proto") + "_descriptor_set.binpb")


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT):
        print(path)
