"""What a failed call's rich status (the grpc-status-details-bin trailer) says: one parser for
every test that reads ErrorInfo, RetryInfo and BadRequest."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status


@dataclass
class Details:
    code: grpc.StatusCode
    message: str
    reason: str
    domain: str
    metadata: dict[str, str]
    retry_seconds: float | None  # None: no RetryInfo
    fields: list[str]  # BadRequest's field violations
    kinds: list[str]  # the detail messages in order, e.g. ["ErrorInfo", "BadRequest"]
    trailer_code: int  # the rich status's own code and message (they must match the call's)
    trailer_message: str


def status_details(error: grpc.RpcError) -> Details:
    """The failed call's status details; the trailer must be there."""
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None, "no grpc-status-details-bin trailer"
    info, retry, fields, kinds = error_details_pb2.ErrorInfo(), None, [], []
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            detail.Unpack(info)
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            delay = error_details_pb2.RetryInfo()
            detail.Unpack(delay)
            retry = delay.retry_delay.ToNanoseconds() / 1e9
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            request = error_details_pb2.BadRequest()
            detail.Unpack(request)
            fields = [v.field for v in request.field_violations]
        kinds.append(detail.type_url.rsplit(".", 1)[-1])
    return Details(
        error.code(),
        error.details() or "",
        info.reason,
        info.domain,
        dict(info.metadata),
        retry,
        fields,
        kinds,
        status.code,
        status.message,
    )


def details_of(call: Callable[[], Any]) -> Details:
    """Make the call, which must fail; what its status details say."""
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return status_details(caught.value)
