"""Server reflection that serves Ladder's .proto with its comments, so `grpcurl describe` shows them.

The descriptors compiled into ladder_pb2 carry no source info (comments and
locations), and grpcio-reflection serializes each file with
`FileDescriptor.CopyToProto`, which drops it anyway. proto/generate.py writes
a FileDescriptorSet with source info beside the stubs; `DocumentedPool` stands
in for the descriptor pool reflection reads and hands out, for the files in
that set, the stored FileDescriptorProto instead. Every other file (health,
reflection itself) comes from the default pool as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import structlog
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection

from proto.ladder.v1 import ladder_pb2

log = structlog.get_logger("ladder.reflection")
# Written by proto/generate.py (descriptor_set_path) beside the stubs.
DESCRIPTOR_SETS = (Path(ladder_pb2.__file__).with_name("ladder_descriptor_set.binpb"),)


class _Documented:
    """A FileDescriptor whose CopyToProto gives its stored proto, source info included."""

    def __init__(self, descriptor: Any, stored: dict[str, descriptor_pb2.FileDescriptorProto]) -> None:
        self._descriptor = descriptor
        self._stored = stored

    @property
    def name(self) -> str:
        return str(self._descriptor.name)

    @property
    def dependencies(self) -> list[_Documented]:
        return [_Documented(d, self._stored) for d in self._descriptor.dependencies]

    def CopyToProto(self, proto: descriptor_pb2.FileDescriptorProto) -> None:  # noqa: N802 — protobuf's name
        stored = self._stored.get(self.name)
        if stored is not None:
            proto.CopyFrom(stored)
        else:
            self._descriptor.CopyToProto(proto)


class DocumentedPool:
    """The descriptor pool reflection reads, with the stored (documented) protos of `stored`."""

    def __init__(
        self,
        stored: dict[str, descriptor_pb2.FileDescriptorProto],
        pool: descriptor_pool.DescriptorPool | None = None,
    ) -> None:
        self._pool = pool or descriptor_pool.Default()
        self._stored = stored

    def FindFileByName(self, name: str) -> _Documented:  # noqa: N802 — the DescriptorPool interface
        return _Documented(self._pool.FindFileByName(name), self._stored)

    def FindFileContainingSymbol(self, symbol: str) -> _Documented:  # noqa: N802
        return _Documented(self._pool.FindFileContainingSymbol(symbol), self._stored)

    def FindMessageTypeByName(self, name: str) -> Any:  # noqa: N802
        return self._pool.FindMessageTypeByName(name)

    def FindExtensionByNumber(self, message: Any, number: int) -> Any:  # noqa: N802
        return self._pool.FindExtensionByNumber(message, number)

    def FindAllExtensions(self, message: Any) -> Any:  # noqa: N802
        return self._pool.FindAllExtensions(message)


def documented_files(paths: Sequence[Path]) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    """The FileDescriptorProtos of these descriptor sets, by file name; a file whose set is missing,
    or whose definitions differ from the compiled-in descriptor's (a stale set), is left out."""
    compiled = descriptor_pb2.FileDescriptorProto()
    ladder_pb2.DESCRIPTOR.CopyToProto(compiled)
    found: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    for path in paths:
        if not path.exists():
            log.warning("reflection_without_source_info", missing=str(path))
            continue
        for file in descriptor_pb2.FileDescriptorSet.FromString(path.read_bytes()).file:
            if file.name != compiled.name:
                continue
            if _definitions(file) != _definitions(compiled):
                log.warning("reflection_without_source_info", stale=str(path))
                continue
            # The compiled definitions (no json_name: JSON clients such as grpcurl keep printing
            # the .proto's field names, as they did before) with the set's comments.
            served = descriptor_pb2.FileDescriptorProto()
            served.CopyFrom(compiled)
            served.source_code_info.CopyFrom(file.source_code_info)
            found[file.name] = served
    return found


def _definitions(file: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    """The file without what protoc adds only to a descriptor set: source info and json names."""
    bare = descriptor_pb2.FileDescriptorProto()
    bare.CopyFrom(file)
    bare.ClearField("source_code_info")
    messages = list(bare.message_type)
    while messages:
        message = messages.pop()
        messages.extend(message.nested_type)
        for field in message.field:
            field.ClearField("json_name")
    return bare


def enable(service_names: Sequence[str], server: grpc.aio.Server) -> None:
    """Serve reflection for `service_names`, Ladder's .proto with its comments."""
    stored = documented_files(DESCRIPTOR_SETS)
    # Reflection only calls the Find* methods above; its stub asks for a real DescriptorPool, which
    # DocumentedPool cannot be (its files are _Documented, not FileDescriptors).
    pool = DocumentedPool(stored)
    reflection.enable_server_reflection(tuple(service_names), server, pool=pool)  # type: ignore[arg-type]
