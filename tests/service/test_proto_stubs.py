"""The committed stubs are exactly what grpcio-tools makes of the committed .proto."""

from __future__ import annotations

from pathlib import Path

from proto import generate


def test_regenerating_the_stubs_from_the_proto_gives_identical_files(tmp_path: Path) -> None:
    written = generate.generate(tmp_path)
    assert written
    for fresh in written:
        committed = generate.ROOT / fresh.relative_to(tmp_path)
        assert committed.read_bytes() == fresh.read_bytes(), f"{committed} is stale"


def test_the_stubs_ask_for_the_grpcio_the_project_declares() -> None:
    from proto.ladder.v1 import ladder_pb2_grpc

    assert ladder_pb2_grpc.GRPC_GENERATED_VERSION == generate.grpcio_floor()


def test_the_generated_grpc_module_imports_from_the_proto_package() -> None:
    from proto.ladder.v1 import ladder_pb2, ladder_pb2_grpc

    assert ladder_pb2.DESCRIPTOR.package == "ladder.v1"
    assert "ladder.v1.Ladder" in {s.full_name for s in ladder_pb2.DESCRIPTOR.services_by_name.values()}
    assert ladder_pb2_grpc.LadderStub is not None
