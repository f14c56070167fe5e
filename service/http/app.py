"""The OpenAI-compatible HTTP API: aiohttp routes on the gRPC server's event loop, over the same generation.

Every call passes what a gRPC call passes, in the same order (`door`): the access log (request id,
in-flight count, one line and one metric, protocol "http"), the drain gate, the bearer token, and
each failure answered from the one error table (service/errors.py) as OpenAI's error object with
its HTTP status and, when a retry may succeed, Retry-After. A stream's failure after its headers
went out is its last event. `/health` (200 while serving, else 503) passes untouched. What aiohttp
refuses itself (an unknown route: 404, listing the endpoints under /v1; a method a route does not
serve: 405 with Allow; a body too slow: 408) is answered as the same error object, logged and counted
as the client's error, never INTERNAL. CORS: cors.py; connection caps and timeouts: connections.py.
"""

from __future__ import annotations

import asyncio
import json
import math
import ssl
import time
import traceback
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import grpc
import structlog
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from service.calls import GenerateCall
from service.config import Config
from service.door.call_context import CALLER, REQUEST_ID, start_call
from service.door.call_log import CallLog
from service.door.callers import Callers
from service.errors import ModelNotFound, Status, TooLarge, status_for
from service.front.front import Front
from service.front.generating import generation
from service.front.progress import Progress
from service.front.tool_calls import tools_at_fault
from service.http import answers, completions, openai
from service.http.connections import Guard, GuardedSite, HttpLimits
from service.http.cors import Cors
from service.metrics import Metrics
from service.sockets import listening_socket

log = structlog.get_logger("ladder.http")
COMPLETIONS, CHAT, MODELS = "/v1/completions", "/v1/chat/completions", "/v1/models"
ENDPOINTS = f"POST {COMPLETIONS}, POST {CHAT}, GET {MODELS}, GET {MODELS}/{{model}}"
UNROUTED = "unknown_route"  # the method label of every call to a route that does not exist
# What a refusal of aiohttp's own is counted as (any other 4xx: INVALID_ARGUMENT).
REFUSAL_CODES = {
    404: grpc.StatusCode.NOT_FOUND,
    405: grpc.StatusCode.UNIMPLEMENTED,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
}
SHOWN_PATH_CHARS = 100
ERROR_TYPES = {401: "authentication_error", 429: "rate_limit_error", 503: "service_unavailable_error"}
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
STREAM = web.RequestKey("ladder_stream", web.StreamResponse)  # a stream whose headers went out


@dataclass
class Door:
    """What every HTTP call passes through, shared with gRPC's interceptors."""

    access_log: CallLog
    gate: Callable[[], None]  # raises Draining while loading or draining
    callers: Callers


def error_body(status: Status, chat: bool) -> dict[str, Any]:
    """OpenAI's error object: the message, a type by HTTP status, the parameter at fault, the reason."""
    kind = ERROR_TYPES.get(
        status.http_status, "invalid_request_error" if status.http_status < 500 else "server_error"
    )
    return {
        "error": {
            "message": status.details,
            "type": kind,
            "param": openai.param_of(status.field, chat) or None,
            "code": status.reason.lower(),
        }
    }


def error_response(status: Status, chat: bool) -> web.Response:
    headers = {}
    if status.retry_seconds is not None and status.http_status in (429, 503):
        headers["Retry-After"] = str(max(1, math.ceil(status.retry_seconds)))
    return web.json_response(error_body(status, chat), status=status.http_status, headers=headers)


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event: `data: <json>` and a blank line."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


def _caller_certificate(request: web.Request) -> str:
    """Under mutual TLS without tokens, the client certificate's common name is the caller (as on gRPC)."""
    certificate = request.transport.get_extra_info("peercert") if request.transport is not None else None
    for part in (certificate or {}).get("subject", ()):
        for key, value in part:
            if key == "commonName":
                return "cn:" + str(value)
    return ""


def make_door(door: Door, cors: Cors) -> Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        missing = request.match_info.http_exception  # no such route, or not with this method
        preflight = cors.preflight(request, missing)
        if preflight is not None:
            return preflight
        if missing is not None:
            return _unrouted(door, request, missing)
        if request.path == "/health":
            return await handler(request)
        name = MODELS if request.path.startswith(MODELS) else request.path
        request_id = start_call(name, request.remote or "", request.headers.get("x-request-id", ""))
        with door.access_log.counted():
            return await _answer(door, request, handler, name, request_id)

    return middleware


async def _answer(
    door: Door, request: web.Request, handler: Handler, name: str, request_id: str
) -> web.StreamResponse:
    try:
        door.gate()
        CALLER.set(
            door.callers.caller({"authorization": request.headers.get("Authorization", "")})
            or _caller_certificate(request)
        )
        response = await handler(request)
    except (asyncio.CancelledError, ConnectionResetError):  # the client went away
        door.access_log.left(name, grpc.StatusCode.CANCELLED, request_id, "http")
        raise
    except web.HTTPException as exc:  # aiohttp's own refusals (a body too slow): the client's error
        if exc.status < 400:
            raise
        return _refused(door, request, name, exc)
    except Exception as exc:  # noqa: BLE001 — every failure goes through the table
        return await _failed(door, request, name, exc)
    door.access_log.succeeded(name, request_id, "http")
    if not response.prepared:
        response.headers["x-request-id"] = request_id
    return response


def _unrouted(door: Door, request: web.Request, missing: web.HTTPException) -> web.Response:
    """A route that does not exist (404), or a method it does not serve (405): counted, logged, answered."""
    name = UNROUTED if missing.status == 404 else MODELS if request.path.startswith(MODELS) else request.path
    start_call(name, request.remote or "", request.headers.get("x-request-id", ""))
    return _refused(door, request, name, missing)


def _refused(door: Door, request: web.Request, name: str, refusal: web.HTTPException) -> web.Response:
    """aiohttp's refusal as OpenAI's error object with its own status (and Allow), the client's error."""
    message = _refusal_message(request, refusal)
    code = refusal.reason.lower().replace(" ", "_")
    kind = REFUSAL_CODES.get(
        refusal.status,
        grpc.StatusCode.INVALID_ARGUMENT if refusal.status < 500 else grpc.StatusCode.UNAVAILABLE,
    )
    door.access_log.failed(name, Status(kind, message, reason=code.upper()), "http")
    headers = {"x-request-id": REQUEST_ID.get()}
    if "Allow" in refusal.headers:
        headers["Allow"] = refusal.headers["Allow"]
    body = {
        "error": {
            "message": message,
            "type": "invalid_request_error" if refusal.status < 500 else "server_error",
            "param": None,
            "code": code,
        }
    }
    return web.json_response(body, status=refusal.status, headers=headers)


def _refusal_message(request: web.Request, refusal: web.HTTPException) -> str:
    path = request.raw_path  # as sent (percent-encodings kept), cut short
    shown = path if len(path) <= SHOWN_PATH_CHARS else path[:SHOWN_PATH_CHARS] + "..."
    if isinstance(refusal, web.HTTPNotFound):
        if path.startswith("/v1/"):
            return f"unknown endpoint {request.method} {shown}; this server serves {ENDPOINTS}"
        return f"no route {request.method} {shown}; the OpenAI-compatible API is {ENDPOINTS}, and GET /health"
    if isinstance(refusal, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(refusal.allowed_methods))
        return f"{request.method} is not allowed on {shown}; it takes {allowed}"
    return refusal.text or refusal.reason


async def _failed(door: Door, request: web.Request, name: str, error: Exception) -> web.StreamResponse:
    status = status_for(error)
    if status.code == grpc.StatusCode.INTERNAL:
        log.error(
            "internal_error",
            method=name,
            request_id=REQUEST_ID.get(),
            error=repr(error),
            traceback="".join(traceback.format_exception(error)),
        )
    door.access_log.failed(name, status, "http")
    chat = request.path == CHAT
    stream: web.StreamResponse | None = request.get(STREAM)
    if stream is None:
        response = error_response(status, chat)
        response.headers["x-request-id"] = REQUEST_ID.get()
        return response
    try:  # the headers went out with 200: the failure is the stream's last event
        await stream.write(sse(error_body(status, chat)))
        await stream.write_eof()
    except ConnectionResetError:
        pass
    return stream


class Routes:
    """The handlers, over the same generation as gRPC's (its limits and scheduler)."""

    def __init__(self, front: Callable[[], Front], ready: Callable[[], bool]) -> None:
        self.front = front
        self.ready = ready
        self.created = int(time.time())

    async def health(self, request: web.Request) -> web.Response:
        ready = self.ready()
        return web.json_response(
            {"status": "SERVING" if ready else "NOT_SERVING"}, status=200 if ready else 503
        )

    def _model(self) -> dict[str, Any]:
        model = self.front().model
        return {
            "id": model.api_names[0],
            "object": "model",
            "created": self.created,
            "owned_by": "ladder",
            "max_model_len": model.capacity,
        }

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._model()]})

    async def model(self, request: web.Request) -> web.Response:
        found = self._model()
        if request.match_info["model"] not in self.front().model.api_names:
            raise ModelNotFound(
                f"the model {request.match_info['model']!r} is not served here", field="model"
            )
        return web.json_response(found)

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's /tokenize: a prompt's (or chat's, templated) token ids and their count."""
        front = self.front()
        prompt = openai.tokenize_prompt(openai.read_body(await _body(request)), front.model.api_names)
        ids = await front.prompt_ids(prompt)
        return web.json_response({"count": len(ids), "max_model_len": front.model.capacity, "tokens": ids})

    async def detokenize(self, request: web.Request) -> web.Response:
        """vLLM's /detokenize: the text of token ids, as Detokenize answers on gRPC."""
        front = self.front()
        ids = openai.detokenize_ids(openai.read_body(await _body(request)), front.model.api_names)
        return web.json_response({"prompt": front.model.detokenize(ids, field="tokens")})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        body = openai.read_body(await _body(request))
        front = self.front()
        call = openai.openai_call(body, chat, front.model.api_names, front.tool_format())
        echoes = await completions.echoes(front, call.generates) if call.echo else ()
        answer = answers.Answer(call, REQUEST_ID.get(), int(time.time()), front.model, echoes)
        with tools_at_fault(call.tools, "tools"):
            if call.stream:
                return await self._stream(request, answer)
            progresses = await completions.first_failure([self._whole(g) for g in call.generates])
        return web.json_response(answer.whole(progresses))

    async def _whole(self, call: GenerateCall) -> Progress:
        """One prompt's generation, to its end."""
        progress = None
        async with aclosing(generation(self.front(), call, unary=True)) as steps:
            async for _, found in steps:
                progress = found
        assert progress is not None
        return progress

    async def _stream(self, request: web.Request, answer: answers.Answer) -> web.StreamResponse:
        """Server-sent events: chunks as tokens come, the usage when asked, then `data: [DONE]`. A
        refusal before every prompt's first event is an HTTP status; the headers go out then."""
        chunks = answers.Chunks(answer)
        prompts = len(answer.call.generates)
        progresses: dict[int, Progress] = {}
        generations = [generation(self.front(), g) for g in answer.call.generates]
        async with aclosing(completions.merged(generations)) as steps:
            waiting = [step async for step in completions.until_each_began(steps, prompts)]
            response = web.StreamResponse(headers={**SSE_HEADERS, "x-request-id": answer.request_id})
            await response.prepare(request)
            request[STREAM] = response
            for chunk in chunks.opening():
                await response.write(sse(chunk))
            async for prompt, (events, progress) in completions.chained(waiting, steps):
                progresses[prompt] = progress
                # The events that arrived together go out in one write: a chunk each, as OpenAI's are.
                written = b"".join(sse(chunk) for event in events for chunk in chunks.of(event, prompt))
                if written:
                    await response.write(written)
        if answer.call.include_usage and progresses:
            await response.write(sse(answer.usage_chunk([progresses[p] for p in sorted(progresses)])))
        await response.write(sse("[DONE]"))
        await response.write_eof()
        return response


async def _body(request: web.Request) -> bytes:
    """The request body, or TooLarge (MESSAGE_TOO_LARGE: 413) over the server's message limit, or 408
    when it does not arrive within --http-body-timeout-seconds."""
    seconds = request.app[BODY_SECONDS]
    try:
        async with asyncio.timeout(seconds):
            return await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise TooLarge(
            f"the request body is over the limit of {request.app[LIMIT]} bytes (--max-message-bytes)",
            reason="MESSAGE_TOO_LARGE",
        ) from exc
    except TimeoutError:
        raise web.HTTPRequestTimeout(
            text=f"the request body did not arrive within {seconds:g} s (--http-body-timeout-seconds)"
        ) from None


LIMIT = web.AppKey("ladder_max_message_bytes", int)
BODY_SECONDS = web.AppKey("ladder_body_timeout_seconds", float)


def application(routes: Routes, door: Door, config: Config) -> web.Application:
    cors = Cors(config.http_cors_origins)
    app = web.Application(middlewares=[make_door(door, cors)], client_max_size=config.max_message_bytes)
    app[LIMIT] = config.max_message_bytes
    app[BODY_SECONDS] = config.http_body_timeout_seconds
    app.on_response_prepare.append(cors.on_prepare)
    app.router.add_get("/health", routes.health)
    app.router.add_get(MODELS, routes.models)
    app.router.add_get(MODELS + "/{model}", routes.model)
    app.router.add_post(COMPLETIONS, routes.completions)
    app.router.add_post(CHAT, routes.chat)
    app.router.add_post("/tokenize", routes.tokenize)
    app.router.add_post("/detokenize", routes.detokenize)
    return app


def ssl_context(config: Config) -> ssl.SSLContext | None:
    """The gRPC port's TLS (and mutual TLS) for the HTTP port too."""
    if not config.tls:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(config.tls_cert, config.tls_key)
    if config.tls_client_ca:
        context.load_verify_locations(config.tls_client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def http_server(
    config: Config,
    metrics: Metrics,
    access_log: CallLog,
    gate: Callable[[], None],
    front: Callable[[], Front],
    ready: Callable[[], bool],
    share_port: bool = False,
) -> HttpServer:
    """The OpenAI-compatible API over the same generation, gate, tokens and access log as gRPC's
    (the server's process, or each frontend process sharing the port)."""
    door = Door(access_log, gate, Callers(config.auth_tokens))
    return HttpServer(application(Routes(front, ready), door, config), config, metrics, share_port)


class HttpServer:
    """The HTTP API's listener: started beside gRPC, stopped after it; on `--host '[::]'` it serves
    IPv4 and IPv6 (service/sockets.py), its connections capped and timed (connections.py)."""

    def __init__(
        self, app: web.Application, config: Config, metrics: Metrics, share_port: bool = False
    ) -> None:
        self.config, self.share_port = config, share_port
        # handler_cancellation: a client that leaves cancels its call (and its job on the worker).
        self.runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
        limits = HttpLimits(
            config.http_max_connections,
            config.http_max_connections_per_peer,
            config.http_header_timeout_seconds,
            config.http_idle_timeout_seconds,
        )
        self.guard = Guard(
            limits,
            metrics.connection_refused,
            lambda listener: metrics.connections_timed_out.labels(listener).inc(),
        )
        self.port = 0

    async def start(self) -> int:
        await self.runner.setup()
        sock = listening_socket(self.config.host, self.config.http_port, share_port=self.share_port)
        try:
            await GuardedSite(self.runner, sock, self.guard, ssl_context(self.config)).start()
        except BaseException:
            sock.close()
            raise
        self.port = int(sock.getsockname()[1])
        return self.port

    async def stop(self) -> None:
        await self.runner.cleanup()
