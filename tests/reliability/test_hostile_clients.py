"""Hostile clients never take the server down or starve others: after every kind (and during the slow
and idle ones) the process is serving, gRPC health answers within a second, a Generate answers, and
HTTP /health answers. The HTTP API answers what it cannot route 404 or 405, what it cannot parse
400 (413 when too large), and never 500.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.hostile import H2_PREFACE, http_status, server_answers, stalled
from tests.support.servers import RunningServer, free_port, server_config

METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE")
ROUTES = {
    "/health": ("GET",),
    "/v1/models": ("GET",),
    "/v1/models/served": ("GET",),
    "/v1/completions": ("POST",),
    "/v1/chat/completions": ("POST",),
}
UNKNOWN = (
    "/",
    "/nope",
    "/v1/completions/",
    "/v1/../v1/models",
    "/v1/%2e%2e/health",
    "/v1/models/a/b",
    "/v1/%ff%fe%fd",
    "/%00",
    "/v1/" + "x" * 4000,
)
IDLE_CONNECTIONS = 1500  # per listener: a few thousand across the suite, fast on a 2-core CI machine
IDLE_PEERS = 6  # their addresses: 250 each, under the HTTP cap per address (256), as many clients would be
MAX_MESSAGE_BYTES = 1 << 20


@pytest.fixture(scope="module")
def running(served_model: Path) -> Iterator[RunningServer]:
    config = server_config(served_model, http_port=free_port(), max_message_bytes=MAX_MESSAGE_BYTES)
    with RunningServer(config) as server:
        yield server


def got_over_it(running: RunningServer) -> None:
    assert not running.server.stopped.is_set() and not running.server.draining
    server_answers(running.address, running.config.http_port)


def allowed(method: str, path: str) -> set[int]:
    """What a request with no body may get: its route's answer, 404 where no route is, 405 where the
    route takes other methods; a path too long for a request line may get 414 or 400."""
    known = ROUTES.get(path)
    if known is None:
        return {404, 414, 400} if len(path) > 1000 else {404}
    if method in known or (method == "HEAD" and "GET" in known):
        return {200, 400, 404}  # a POST without a body is 400; the model's route names its own
    return {405}


@pytest.mark.parametrize("path", [*ROUTES, *UNKNOWN])
def test_every_method_on_every_path_is_answered_404_405_or_its_route_never_500(
    running: RunningServer, path: str
) -> None:
    answers = {method: http_status(running.config.http_port, method, path) for method in METHODS}
    wrong = {method: status for method, status in answers.items() if status not in allowed(method, path)}
    assert not wrong, f"{path}: {wrong}"
    got_over_it(running)


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize(
    ("body", "statuses"),
    [
        (b"[" * 100_000 + b"]" * 100_000, {400}),
        (b'{"prompt": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_000 + b"}", {400}),
        (b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", {400}),
        (b'{"prompt": "unterminated', {400}),
        (b"\xff\xfe not utf-8", {400}),
        (json.dumps({"prompt": "x" * (4 * MAX_MESSAGE_BYTES)}).encode(), {400, 413}),
    ],
    ids=["nested-arrays", "nested-objects", "nested-messages", "invalid", "not-utf8", "huge"],
)
def test_a_body_nested_deep_invalid_or_huge_is_a_client_error_never_500(
    running: RunningServer, route: str, body: bytes, statuses: set[int]
) -> None:
    status = http_status(running.config.http_port, "POST", route, body, {"Content-Type": "application/json"})
    assert status in statuses
    got_over_it(running)


@contextmanager
def trickling(port: int, data: bytes, clients: int = 20) -> Iterator[None]:
    """`clients` connections sending `data` a byte at a time (every 20 ms) until the block ends."""
    stop = threading.Event()

    def trickle() -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            for byte in data:
                if stop.wait(0.02):
                    return
                try:
                    sock.send(bytes([byte]))
                except OSError:  # the server closed it: what a timeout may do
                    return

    threads = [threading.Thread(target=trickle, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.5)  # every trickle under way
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)


SLOW_HEADERS = b"GET /health HTTP/1.1\r\nHost: ladder\r\n" + b"X-Slow: " + b"a" * 1000 + b"\r\n\r\n"
SLOW_BODY = (
    b"POST /v1/completions HTTP/1.1\r\nHost: ladder\r\nContent-Type: application/json\r\n"
    b"Content-Length: 2000\r\n\r\n" + b'{"prompt": "' + b"a" * 1980
)


@pytest.mark.parametrize("data", [SLOW_HEADERS, SLOW_BODY], ids=["headers", "body"])
def test_clients_sending_a_byte_at_a_time_over_http_hold_back_nobody(
    running: RunningServer, data: bytes
) -> None:
    with trickling(running.config.http_port, data):
        got_over_it(running)
    got_over_it(running)


def test_clients_sending_the_http2_preface_a_byte_at_a_time_hold_back_nobody(running: RunningServer) -> None:
    with trickling(running.port, H2_PREFACE * 10):
        got_over_it(running)
    got_over_it(running)


@pytest.mark.parametrize("listener", ["grpc", "http", "grpc-preface"])
def test_idle_connections_by_the_thousand_hold_back_nobody(running: RunningServer, listener: str) -> None:
    port = running.config.http_port if listener == "http" else running.port
    with stalled(port, IDLE_CONNECTIONS, H2_PREFACE if listener == "grpc-preface" else b"", IDLE_PEERS):
        got_over_it(running)
    got_over_it(running)


@pytest.mark.parametrize("sent", [1, 1000, 60_000])
def test_a_client_that_disconnects_mid_body_costs_nothing(running: RunningServer, sent: int) -> None:
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: ladder\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000\r\n\r\n"
    )
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", running.config.http_port), timeout=10) as sock:
            sock.sendall(head + b"[" * sent)
    got_over_it(running)


HUGE = "1" + "0" * 310  # past a double: float() overflowed on it, int32 fields took it silently
SURROGATE = '"\\ud800"'  # a lone UTF-16 surrogate: valid JSON, not Unicode; encoding it raised
COMPLETION, CHAT = '"prompt": "Hi"', '"messages": [{"role": "user", "content": "Hi"}]'
ROUTES_AND_BASES = (("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT))
# Every field of the two POST routes that takes a number: a JSON object's members, @ the value.
NUMBER_FIELDS = [
    (route, f'{base}, "{name}": @')
    for route, base in ROUTES_AND_BASES
    for name in (
        "temperature",
        "top_p",
        "min_p",
        "top_k",
        "max_tokens",
        "n",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
    )
] + [
    ("/v1/completions", f'{COMPLETION}, "logprobs": @'),
    ("/v1/completions", f'{COMPLETION}, "best_of": @'),
    ("/v1/chat/completions", f'{CHAT}, "max_completion_tokens": @'),
    ("/v1/chat/completions", f'{CHAT}, "logprobs": true, "top_logprobs": @'),
    ("/v1/completions", f'{COMPLETION}, "stop_token_ids": [@]'),
]
# ... and every field that takes a string (or strings).
STRING_FIELDS = [
    ("/v1/completions", '"prompt": @'),
    ("/v1/completions", '"prompt": ["Hi", @]'),
    ("/v1/chat/completions", '"messages": [{"role": "user", "content": @}]'),
    ("/v1/chat/completions", '"messages": [{"role": @, "content": "Hi"}]'),
    ("/v1/chat/completions", '"messages": [{"role": "user", "content": [{"type": "text", "text": @}]}]'),
    ("/v1/chat/completions", '"messages": [{"role": "user", "content": "Hi", "name": @}]'),
    *(
        (route, f'{base}, "{name}": @')
        for route, base in ROUTES_AND_BASES
        for name in ("model", "stop", "user", "guided_regex", "guided_grammar", "guided_json")
    ),
    ("/v1/completions", f'{COMPLETION}, "stop": ["x", @]'),
    ("/v1/completions", f'{COMPLETION}, "guided_choice": ["a", @]'),
    ("/v1/chat/completions", f'{CHAT}, "response_format": {{"type": @}}'),
    (
        "/v1/chat/completions",
        f'{CHAT}, "response_format": {{"type": "json_schema", '
        f'"json_schema": {{"name": @, "schema": {{"type": "object"}}}}}}',
    ),
]


def post(running: RunningServer, route: str, members: str, value: str) -> int:
    body = "{" + members.replace("@", value) + "}"
    return http_status(
        running.config.http_port, "POST", route, body.encode(), {"Content-Type": "application/json"}
    )


@pytest.mark.parametrize(("route", "members"), NUMBER_FIELDS)
def test_every_number_field_fed_a_310_digit_number_is_a_400_and_the_server_serves(
    running: RunningServer, route: str, members: str
) -> None:
    for value in (HUGE, "-" + HUGE):
        assert post(running, route, members, value) == 400, (members, value[:5])
    got_over_it(running)


@pytest.mark.parametrize(("route", "members"), STRING_FIELDS)
def test_every_string_field_fed_a_lone_surrogate_is_a_400_and_the_server_serves(
    running: RunningServer, route: str, members: str
) -> None:
    assert post(running, route, members, SURROGATE) == 400, members
    got_over_it(running)
