"""The HTTP API against what the internet sends: unknown routes and methods, odd paths, hostile bodies,
browsers (CORS), and connections that pile up or send their headers slowly. Every refusal is an
OpenAI error object with its own status, counted, and the server keeps serving."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from service.config import Config
from tests.support.servers import RunningServer, free_port, server_config
from tests.support.waiting import wait_for

ORIGIN = "https://app.example"


@pytest.fixture(scope="module")
def running(served_model: Path) -> Iterator[RunningServer]:
    with RunningServer(server_config(served_model, http_port=free_port())) as server:
        yield server


@pytest.fixture(scope="module")
def guarded(served_model: Path) -> Iterator[RunningServer]:
    """CORS for one origin; two connections per address, three in all; headers, bodies timed short."""
    config = server_config(
        served_model,
        host=Config().host,
        http_port=free_port(),
        http_cors_origins=(ORIGIN,),
        http_max_connections=3,
        http_max_connections_per_peer=2,
        http_header_timeout_seconds=0.5,
        http_body_timeout_seconds=0.5,
        frontends=0,  # the guard's counters are read in this process
    )
    with RunningServer(config) as server:
        yield server


def ask(
    running: RunningServer,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[http.client.HTTPResponse, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", running.config.http_port, timeout=30)
    try:
        connection.request(method, path, body, headers or {})
        response = connection.getresponse()
        return response, response.read()
    finally:
        connection.close()  # none left open to count against the connection caps


def error_of(data: bytes) -> dict[str, Any]:
    error: dict[str, Any] = json.loads(data)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def http_calls(running: RunningServer, method: str, code: str) -> float:
    labels = {"protocol": "http", "method": method, "code": code}
    return running.server.metrics.registry.get_sample_value("ladder_calls_total", labels) or 0.0


def still_serving(running: RunningServer) -> None:
    assert ask(running, "GET", "/health")[0].status == 200
    assert ask(running, "GET", "/v1/models")[0].status == 200


@pytest.mark.parametrize(
    "method, path",
    [
        ("GET", "/"),
        ("GET", "/v1/embeddings"),
        ("POST", "/v1/embeddings"),
        ("POST", "/v1/responses"),
        ("GET", "/tokenizer_info"),
        ("GET", "/v1/models/"),
        ("POST", "/v1/chat/completions/"),
        ("GET", "/v1/../etc/passwd"),
        ("GET", "/v1/%ff%fe"),
        ("GET", "/%c0%af"),
        ("GET", "/v1/" + "a" * 4000),
    ],
)
def test_an_unknown_route_is_a_404_openai_error_counted_as_the_clients(
    running: RunningServer, method: str, path: str
) -> None:
    before = http_calls(running, "unknown_route", "NOT_FOUND")
    response, data = ask(running, method, path, b"{}" if method == "POST" else None)
    error = error_of(data)
    assert response.status == 404 and error["code"] == "not_found"
    assert error["type"] == "invalid_request_error" and response.getheader("x-request-id")
    assert len(error["message"]) < 400
    if path.startswith("/v1/") and ".." not in path:
        assert "POST /v1/chat/completions" in error["message"] and "GET /v1/models" in error["message"]
    assert http_calls(running, "unknown_route", "NOT_FOUND") == before + 1
    still_serving(running)


@pytest.mark.parametrize(
    "method, path, allowed",
    [
        ("GET", "/v1/completions", "POST"),
        ("GET", "/v1/chat/completions", "POST"),
        ("DELETE", "/v1/models", "GET"),
        ("PUT", "/v1/models/anything", "GET"),
        ("POST", "/health", "GET"),
        ("OPTIONS", "/v1/chat/completions", "POST"),
    ],
)
def test_a_method_a_route_does_not_serve_is_a_405_naming_the_allowed_ones(
    running: RunningServer, method: str, path: str, allowed: str
) -> None:
    response, data = ask(running, method, path)
    error = error_of(data)
    assert response.status == 405 and error["code"] == "method_not_allowed"
    assert allowed in response.getheader("Allow", "") and allowed in error["message"]
    assert response.getheader("Access-Control-Allow-Origin") is None  # CORS is off by default
    still_serving(running)


def test_a_path_longer_than_a_request_line_may_be_is_refused_not_failed(running: RunningServer) -> None:
    response, _ = ask(running, "GET", "/v1/" + "a" * 9000)
    assert 400 <= response.status < 500
    still_serving(running)


@pytest.mark.parametrize(
    "body, says",
    [
        (b"[" * 100_000 + b"]" * 100_000, "limit of 64 levels"),
        (b'{"a": ' * 65 + b"1" + b"}" * 65, "64 levels"),
        (b"[1, 2]", "not a JSON object"),
        (b"3", "not a JSON object"),
        (b'"text"', "not a JSON object"),
        (b'{"prompt": "\xff\xfe"}', "not JSON"),
        (b'{"prompt": ', "not JSON"),
        (b"", "not JSON"),
    ],
)
def test_a_body_that_is_not_a_shallow_json_object_is_a_400(
    running: RunningServer, body: bytes, says: str
) -> None:
    response, data = ask(running, "POST", "/v1/completions", body, {"Content-Type": "application/json"})
    error = error_of(data)
    assert response.status == 400 and error["type"] == "invalid_request_error"
    assert says in error["message"]
    still_serving(running)


HUGE = "1" + "0" * 310  # past a double: float() overflows on it
FIELDS_OUT_OF_RANGE = [
    (b'{"prompt": "x", "temperature": %s}' % HUGE.encode(), "/v1/completions", "temperature"),
    (b'{"prompt": "x", "top_p": %s}' % HUGE.encode(), "/v1/completions", "top_p"),
    (b'{"prompt": "x", "min_p": -%s}' % HUGE.encode(), "/v1/completions", "min_p"),
    (b'{"prompt": "x", "frequency_penalty": NaN}', "/v1/completions", "frequency_penalty"),
    (b'{"prompt": "x", "presence_penalty": Infinity}', "/v1/completions", "presence_penalty"),
    (b'{"prompt": "\\ud800"}', "/v1/completions", "prompt"),
    (b'{"prompt": ["ok", "\\udfff"]}', "/v1/completions", "prompt[1]"),
    (
        b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
        "/v1/chat/completions",
        "messages[0].content",
    ),
    (b'{"messages": [{"role": "\\ud800", "content": "hi"}]}', "/v1/chat/completions", "messages[0].role"),
    (b'{"prompt": "x", "guided_regex": "\\ud800"}', "/v1/completions", "guided_regex"),
    (b'{"prompt": "x", "guided_choice": ["\\ud800"]}', "/v1/completions", "guided_choice[0]"),
    (
        b'{"prompt": "x", "stop_token_ids": [1000000000000000000000000000000]}',
        "/v1/completions",
        "stop_token_ids[0]",
    ),
    (b'{"prompt": "x", "stop_token_ids": [-1]}', "/v1/completions", "stop_token_ids"),
]


@pytest.mark.parametrize("body, path, field", FIELDS_OUT_OF_RANGE)
def test_a_number_out_of_range_or_a_lone_surrogate_is_a_400_naming_its_field(
    running: RunningServer, body: bytes, path: str, field: str
) -> None:
    response, data = ask(running, "POST", path, body, {"Content-Type": "application/json"})
    error = error_of(data)
    # The message names the value's place in the body; param is OpenAI's parameter it belongs to.
    assert response.status == 400 and error["message"].startswith(field), error
    assert error["param"] in (field, field.split("[")[0]), error
    still_serving(running)


def test_a_preflight_from_an_allowed_origin_is_answered_and_responses_carry_the_origin(
    guarded: RunningServer,
) -> None:
    asked = {
        "Origin": ORIGIN,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    response, _ = ask(guarded, "OPTIONS", "/v1/chat/completions", headers=asked)
    assert response.status == 204
    assert response.getheader("Access-Control-Allow-Origin") == ORIGIN
    assert "POST" in response.getheader("Access-Control-Allow-Methods", "")
    assert response.getheader("Access-Control-Allow-Headers") == "authorization, content-type, x-request-id"
    assert int(response.getheader("Access-Control-Max-Age", "0")) > 0
    answered, data = ask(guarded, "GET", "/v1/models", headers={"Origin": ORIGIN})
    assert answered.status == 200 and answered.getheader("Access-Control-Allow-Origin") == ORIGIN
    refused, _ = ask(guarded, "POST", "/v1/completions", b"[]", {"Origin": ORIGIN})
    assert refused.status == 400 and refused.getheader("Access-Control-Allow-Origin") == ORIGIN


def test_a_preflight_from_another_origin_is_a_405_without_cors_headers(guarded: RunningServer) -> None:
    asked = {"Origin": "https://elsewhere.example", "Access-Control-Request-Method": "POST"}
    response, _ = ask(guarded, "OPTIONS", "/v1/chat/completions", headers=asked)
    assert response.status == 405 and response.getheader("Access-Control-Allow-Origin") is None
    assert ask(guarded, "OPTIONS", "/v1/nothing", headers={**asked, "Origin": ORIGIN})[0].status == 404


def connect(running: RunningServer, address: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection((address, running.config.http_port), timeout=5)


def refused_at_once(running: RunningServer, address: str = "127.0.0.1") -> bool:
    """Whether a new connection is closed by the server as it is accepted (the reset may come so soon
    that connecting itself fails)."""
    try:
        sock = connect(running, address)
    except ConnectionResetError:
        return True
    with sock:
        return closed_by_server(sock)


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed the connection (a reset or an end of stream) within the timeout."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def counter(running: RunningServer, name: str, **labels: str) -> float:
    return running.server.metrics.registry.get_sample_value(name, labels) or 0.0


def test_connections_past_the_caps_per_address_and_in_all_are_closed_and_counted(
    guarded: RunningServer,
) -> None:
    refused = "ladder_connections_refused_total"
    guard = guarded.server.http.guard  # type: ignore[union-attr]
    wait_for(lambda: guard.open == 0, what="the earlier tests' connections closed")
    held = [connect(guarded), connect(guarded)]  # the cap of one address
    try:
        wait_for(lambda: guard.open == 2, what="the two connections admitted")
        assert refused_at_once(guarded)
        assert counter(guarded, refused, listener="http", reason="connections_per_peer") == 1
        held.append(connect(guarded, "::1"))  # another address: the third, the cap of all
        # Admitted before the next one arrives (a fixed sleep lost this race on a busy CI machine).
        wait_for(lambda: guard.open == 3, what="the third connection admitted")
        assert refused_at_once(guarded, "::1")
        assert counter(guarded, refused, listener="http", reason="connections") == 1
    finally:
        for sock in held:
            sock.close()
    wait_for(lambda: guard.open == 0, what="the held connections closed")
    still_serving(guarded)


def test_headers_sent_too_slowly_close_the_connection(guarded: RunningServer) -> None:
    before = counter(guarded, "ladder_connections_timed_out_total", listener="http")
    with connect(guarded) as slow:
        slow.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # never finished
        slow.settimeout(5)
        started = time.monotonic()
        assert closed_by_server(slow) and time.monotonic() - started < 4
    assert counter(guarded, "ladder_connections_timed_out_total", listener="http") == before + 1
    with connect(guarded) as kept:  # a kept-alive connection answers in time, then idles past the timeout
        kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert kept.recv(65536).startswith(b"HTTP/1.1 200")
        time.sleep(0.8)
        kept.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert kept.recv(65536).startswith(b"HTTP/1.1 200")


def test_a_body_that_does_not_arrive_in_time_is_a_408(guarded: RunningServer) -> None:
    with connect(guarded) as slow:
        slow.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"pro'
        )
        answer = slow.recv(65536)
    assert answer.startswith(b"HTTP/1.1 408") and b"--http-body-timeout-seconds" in answer
