"""The one typed configuration object, built once from flags and the environment.

This module is the only place Ladder reads the environment, the seed's
ONNX_GENAI_PREFILL_QUERY_PADDING=0 switch included. Every setting has a flag
(`--max-sessions`) and an environment variable (`LADDER_MAX_SESSIONS`); a flag
wins over the environment, the environment over the default. Everything else
receives a frozen Config (or the EngineOptions derived from it) explicitly.

Each field is parsed by its type (read with typing.get_type_hints, not from the
annotation's text) and checked against what it allows; a bad value is a
ConfigError whose one-line message names the flag or variable it came from,
the value, and what is allowed. `load_config` is the process's entry: by
default it prints that line and exits 2, as argparse does for a bad flag.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from service.settings import BOUNDS, CHOICES, HELP

if TYPE_CHECKING:  # imported where it is built: the executor loads onnxruntime, and a bad flag
    from engine.options import EngineOptions  # is refused before any of that (~0.1 s)

PADDING_SWITCH = "ONNX_GENAI_PREFILL_QUERY_PADDING"
ENV_PREFIX = "LADDER_"
_TRUE = ("1", "true", "on", "yes")
_FALSE = ("0", "false", "off", "no")
DEFAULT_METRICS_PORT = 9464  # not Prometheus's own 9090
DEFAULT_HTTP_PORT = 8000  # vLLM's and TGI's port for the OpenAI-compatible API


class ConfigError(ValueError):
    """A setting that cannot be used; the message is one line naming it, its value and what is allowed."""


def parse_bool(text: str, source: str) -> bool:
    """Strictly one of 1/true/on/yes or 0/false/off/no (any case); anything else is a ConfigError."""
    value = text.strip().lower()
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    raise ConfigError(f"{source}={text!r} is not a boolean: use one of {', '.join(_TRUE + _FALSE)}")


def padding_enabled(env: Mapping[str, str]) -> bool:
    """Padding is on unless the seed's switch says 0 (or false/off/no); other values are refused
    (set but empty: as if unset)."""
    return parse_bool(env.get(PADDING_SWITCH) or "1", PADDING_SWITCH)


def default_model_cache(env: Mapping[str, str]) -> str:
    """Where the default model is prepared: $XDG_CACHE_HOME/ladder, else ~/.cache/ladder."""
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "ladder")


@dataclass(frozen=True)
class Config:
    host: str = "[::]"
    port: int = 50051
    metrics_port: int = DEFAULT_METRICS_PORT  # 0 = no metrics endpoint
    http_port: int = DEFAULT_HTTP_PORT  # the OpenAI-compatible HTTP API; 0 = off
    # What HTTP connections may hold (service/http/connections.py), and which origins may call (CORS).
    http_max_connections: int = 2048  # open at once on the HTTP port; past it a new one is closed
    http_max_connections_per_peer: int = 256  # open at once from one client address
    http_header_timeout_seconds: float = 10.0  # a request's headers, from its first byte (or the connection)
    http_body_timeout_seconds: float = 60.0  # a request's whole body
    http_idle_timeout_seconds: float = 75.0  # a kept-alive connection with no request this long is closed
    http_cors_origins: tuple[str, ...] = ()  # origins browsers may call from; "*" any; () = CORS off
    # Frontend processes sharing the ports (service/processes/frontend.py); 0 = in this process,
    # None = auto: 2 on CUDA (docs/benchmarks.md: they pay on the H200 and H100), 0 on CPU.
    frontends: int | None = None
    # How calls reach the core (service/core/orders.py): direct, or its orders over a local socket
    # (service/core/core_link.py), as the process cut's frontends will send them.
    core_transport: str = "direct"
    # What gRPC connections may hold (service/ports.py): each process serving the port caps its own.
    grpc_max_connections: int | None = None  # None = auto: half the process's open-file limit
    grpc_max_concurrent_streams: int = 4096  # calls one connection may have open at once
    grpc_handshake_timeout_seconds: float = 10.0  # a connection's TCP accept to its HTTP/2 settings
    grpc_idle_timeout_seconds: float = 120.0  # a connection with no call this long is closed (GOAWAY)
    max_calls_per_peer: int = 0  # Ladder calls one client address may have open at once; 0 = no limit
    model: str = "default"  # a model directory, or "default" (prepared under model_cache)
    model_cache: str = ""
    served_model_name: str = ""  # the model's id in the OpenAI API; "" = the model directory's name
    model_precision: str = "auto"  # weights of the default model: auto (int4 on CPU, fp16 on CUDA) | fp32
    model_read_only: bool = False  # never rewrite the model's graph (its head then runs on every row)
    provider: str = "cpu"  # cpu | cuda
    padding: bool = True
    chunk_size: int | None = None  # override the model's chunk width; 0 = no chunking
    capacity: int | None = None  # KV capacity per session; None = the model's max length
    variant_capacity: int = 0  # 0 = every planned shape: the prefill ladder + the decode batch widths
    max_sessions: int = 8
    warm_up: bool = True  # prepare every planned shape (graph captures on CUDA) before serving
    lookahead: bool = True  # CUDA: launch the next decode forward before its tokens are read
    decode_chain: bool = True  # CUDA, with lookahead: greedy steps chosen and relaunched on the device
    cuda_wait: str = "spin"  # CUDA: how the host waits for the device: spin | block | replay
    replay_thread: bool = False  # CUDA: graph replays on a thread of their own (host work overlaps them)
    memory_budget_mb: int = 0  # weights + KV + variants; the pool holds as many KV slots as fit
    max_queue: int = 64  # requests the engine worker holds at once
    session_idle_seconds: float = 300.0
    drain_seconds: float = 20.0
    max_prompt_tokens: int = 0  # 0 = the KV capacity
    max_new_tokens: int = 1024  # the most one request may ask for
    default_max_new_tokens: int = 256  # what a request that names none gets (0 = as many as fit)
    max_message_bytes: int = 4 * 1024 * 1024
    sessions_per_caller: int = 0  # 0 = every KV slot but one (at least one): a fair share
    # Sessions beyond slots: idle sessions park off their KV slot (KV kept exactly) in up to this many
    # MB, so sessions open are bounded by memory, slots only the decode batch. None = auto
    # (half the host memory free once the model is loaded, plus on CUDA the device's share below); 0 = off.
    session_memory_mb: int | None = None
    # Of that, what one caller's open sessions may hold (counted as if all parked), so no caller can
    # take it all. None = auto (half of it when auth tells callers apart, else no limit); 0 = no limit.
    session_memory_per_caller_mb: int | None = None
    # CUDA: of that, parked KV kept in device memory; past it the most idle spill to pinned host
    # memory. None = auto (half the device memory free once the model is warm).
    session_device_memory_mb: int | None = None
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""  # set: clients must present a certificate it signed (mTLS)
    auth_tokens: tuple[str, ...] = ()  # bearer tokens; "name=token" names the caller
    pod_name: str = ""
    intra_op_threads: int = 0
    log_level: str = "info"
    prefix_sharing: bool = True  # prompts starting with a held prefix (ladder steps) copy it
    prefix_across_callers: bool = False  # share prefixes between callers authenticated apart (leaks timing)
    deterministic: bool = False  # a request's tokens and log-probabilities depend on the request alone
    prefill_batch: int = 0  # new prompts' first chunks in one prefill forward (0 = the backend's: 8 on CUDA)
    constraint_cache_mb: int = 256  # compiled structured-output constraints and their masks
    constraint_compile_seconds: float = 2.0  # CPU seconds one constraint's compile may take
    json_schema_strict: bool = False  # read JSON schemas as OpenAI's strict mode does (no undeclared members)
    tool_call_format: str = "auto"  # the model's tool-call format (service/front/tool_formats.py)
    # Speculative decoding (issue #44): a stream decoding alone drafts from its own tokens (prompt
    # lookup) and verifies the draft in one forward. auto = on where this machine's kernels compute
    # a verification row as a decode step does (measured at load); never in the deterministic mode.
    speculate: str = "auto"  # off | lookup | auto
    speculate_tokens: int = 4  # drafted tokens one verification forward checks at most

    def engine_options(self) -> EngineOptions:
        from engine.options import EngineOptions

        return EngineOptions(
            provider=self.provider,
            padding=self.padding,
            chunk_size=self.chunk_size,
            capacity=self.capacity,
            variant_capacity=self.variant_capacity,
            max_sessions=self.max_sessions,
            intra_op_threads=self.intra_op_threads,
            memory_budget_bytes=self.memory_budget_mb << 20,
            lookahead=self.lookahead,
            decode_chain=self.decode_chain,
            cuda_wait=self.cuda_wait,
            replay_thread=self.replay_thread,
            prefix_sharing=self.prefix_sharing,
            graph_read_only=self.model_read_only,
            deterministic=self.deterministic,
            prefill_batch=self.prefill_batch,
            speculate=self.speculate != "off" and not self.deterministic,
            graph_cache=Path(self.model_cache) / "graphs" if self.model_cache else None,
        )

    @property
    def default_model_precision(self) -> str:
        """The default model's weights: as configured, else int4 (MatMulNBits) on CPU, fp16 on CUDA."""
        if self.model_precision != "auto":
            return self.model_precision
        return "fp16" if self.provider == "cuda" else "int4"

    @property
    def frontend_processes(self) -> int:
        """gRPC frontend processes: as configured, else 2 on CUDA and none on CPU."""
        if self.frontends is not None:
            return self.frontends
        return 2 if self.provider == "cuda" else 0

    def speculation(self, exact: bool) -> int:
        """Drafted tokens per verification forward (0: speculation off), given whether the engine's
        verification rows are its decode rows (`KernelRules.speculation_exact`)."""
        if self.deterministic or self.speculate == "off" or (self.speculate == "auto" and not exact):
            return 0
        return self.speculate_tokens

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert and self.tls_key)

    @property
    def auth(self) -> bool:
        return bool(self.auth_tokens)


PROTOBUF_BACKEND = "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"


def child_environment(protobuf_backend: str) -> dict[str, str]:
    """The environment a frontend process starts with: this process's, with its own protobuf backend
    named. Importing onnxruntime_extensions' converter sets PROTOBUF_BACKEND=python in the
    environment (after this process chose upb), and a frontend, which builds every response
    message, would otherwise run the pure-Python protobuf: 0.40x served tokens on the CPU proxy
    (bench/results/token-level-frontends-2026-12-05)."""
    return {**os.environ, PROTOBUF_BACKEND: protobuf_backend}


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def _kinds() -> dict[str, object]:
    """Each field's type, resolved (not its annotation's text)."""
    return dict(typing.get_type_hints(Config))


def _optional(kind: object) -> object | None:
    """X when `kind` is X | None, else None."""
    args = typing.get_args(kind)
    if type(None) in args and len(args) == 2:
        inner: object = next(a for a in args if a is not type(None))
        return inner
    return None


def _noun(kind: object) -> str:
    inner = _optional(kind)
    if inner is not None:
        return f"{_noun(inner)} or auto"
    nouns: dict[object, str] = {int: "a whole number", float: "a number", bool: "a boolean"}
    return nouns.get(kind, "a value")


def _allowed(name: str, kind: object) -> str:
    if name in CHOICES:
        return "one of " + ", ".join(CHOICES[name])
    low, high = BOUNDS.get(name, (None, None))
    noun = _noun(kind)
    if low is not None and high is not None:
        return f"{noun} from {low:g} to {high:g}"
    return f"{noun} >= {low:g}" if low is not None else noun


_AUTO = ("", "none", "auto")  # what an optional field reads as None


def parse_setting(name: str, text: str, kind: object, source: str) -> object:
    """One setting's value from its flag or environment text, by the field's type (X | None: X, or None
    for auto); a type no text parses to is a TypeError here, not a string passed on."""
    value = text.strip()
    inner = _optional(kind)
    if inner is not None and value.lower() in _AUTO:
        return None
    scalar = inner if inner is not None else kind
    if scalar is bool:
        return parse_bool(text, source)
    if scalar is str:
        return value.lower() if name in CHOICES else text
    if scalar == tuple[str, ...]:
        return tuple(t.strip() for t in text.split(",") if t.strip())
    if scalar not in (int, float):
        raise TypeError(f"Config.{name}: no parser for {kind}")
    try:
        return int(value) if scalar is int else float(value)
    except ValueError:
        raise ConfigError(f"{source}={text!r} is not allowed: {name} takes {_allowed(name, kind)}") from None


def _check(name: str, value: object, kind: object, source: str) -> None:
    """Raise ConfigError when `value` is outside what field `name` allows."""
    bad = False
    if name in CHOICES:
        bad = value not in CHOICES[name]
    elif name in BOUNDS and value is not None:
        low, high = BOUNDS[name]
        number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
        bad = number is None or number != number or number < low or (high is not None and number > high)
    if bad:
        raise ConfigError(f"{source}={value!r} is not allowed: {name} takes {_allowed(name, kind)}")


def _help(name: str, default: object) -> str:
    text = HELP.get(name, name.replace("_", " "))
    allowed = f"; {_allowed(name, _kinds()[name])}" if name in CHOICES else ""
    shown = "on" if default is True else "off" if default is False else "auto" if default is None else default
    shown = "" if shown in ("", ()) else f" (default: {shown})"
    return f"{text}{allowed}{shown} [env {env_name(name)}]".replace("%", "%%")


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Add one --flag per Config field (defaults None: unset flags fall through to the environment)."""
    parser = parser or _Parser(prog="ladder serve", description="Serve a model over gRPC.")
    defaults = Config()
    for field in fields(Config):
        default = getattr(defaults, field.name)
        parser.add_argument(
            flag_name(field.name),
            dest=field.name,
            default=None,
            metavar=field.name.upper(),
            help=_help(field.name, default),
        )
    return parser


def config_from(flags: Mapping[str, object], env: Mapping[str, str] | None = None) -> Config:
    """Flags (None = unset; other keys ignored) over LADDER_* env (default os.environ) over defaults.

    Raises ConfigError naming the flag or variable of the first bad value."""
    env = os.environ if env is None else env
    kinds = _kinds()
    values: dict[str, object] = {}
    sources: dict[str, str] = {}
    for field in fields(Config):
        name, kind = field.name, kinds[field.name]
        text, source = flags.get(name), flag_name(name)
        if text is None and (found := env.get(env_name(name))):  # set but empty: as if unset
            text, source = found, env_name(name)
        if text is None:
            continue
        if isinstance(text, str):
            value = parse_setting(name, text, kind, source)
        else:  # typed already (another parser's flags)
            value = tuple(text) if isinstance(text, list) else text
        _check(name, value, kind, source)
        values[name], sources[name] = value, source
    if "padding" not in values:
        values["padding"] = padding_enabled(env)
    values.setdefault("model_cache", default_model_cache(env))
    values.setdefault("pod_name", socket.gethostname().split(".")[0])
    config = Config(**values)  # type: ignore[arg-type]
    validate(config, sources)
    return config


def validate(config: Config, sources: Mapping[str, str] | None = None) -> None:
    """Raise ConfigError for a value out of range, or settings that cannot work together."""
    sources = sources or {}

    def named(name: str) -> str:
        return sources.get(name) or f"{flag_name(name)}/{env_name(name)}"

    kinds = _kinds()
    for field in fields(Config):
        _check(field.name, getattr(config, field.name), kinds[field.name], named(field.name))
    if bool(config.tls_cert) != bool(config.tls_key):
        missing = "tls_key" if config.tls_cert else "tls_cert"
        raise ConfigError(f"TLS needs both a certificate and a key: {named(missing)} is not set")
    if config.tls_client_ca and not config.tls:
        raise ConfigError(
            f"{named('tls_client_ca')} (mutual TLS) needs {named('tls_cert')} and {named('tls_key')}"
        )
    if config.model != "default" and not (Path(config.model) / "genai_config.json").is_file():
        raise ConfigError(
            f'{named("model")}={config.model!r} is not allowed: model takes "default" or a '
            "model directory (one with genai_config.json)"
        )
    for name in ("tls_cert", "tls_key", "tls_client_ca"):
        path = getattr(config, name)
        if path and not Path(path).is_file():
            raise ConfigError(f"{named(name)}={path!r} is not allowed: {name} takes a readable file")
    if "default_max_new_tokens" in sources and config.default_max_new_tokens > config.max_new_tokens:
        raise ConfigError(
            f"{named('default_max_new_tokens')}={config.default_max_new_tokens} is not "
            f"allowed: it is over {named('max_new_tokens')}={config.max_new_tokens}, the most "
            "a request may ask for"
        )
    if "." in config.pod_name:
        raise ConfigError(
            f"{named('pod_name')}={config.pod_name!r} is not allowed: it may not contain '.' "
            "(it separates the pod from the session token)"
        )


def _fail(message: str) -> NoReturn:
    print(f"ladder serve: {message}", file=sys.stderr)
    raise SystemExit(2)


def load_config(
    env: Mapping[str, str] | None = None, argv: Sequence[str] | None = None, *, exit_on_error: bool = True
) -> Config:
    """Build the Config from flags (none unless argv is given) and the environment (os.environ by default).

    A bad flag or variable: one line on stderr naming it, its value and what is allowed, then
    exit 2 (as argparse does); with exit_on_error=False a ConfigError instead."""
    flags = vars(build_parser().parse_args(list(argv or [])))
    try:
        return config_from(flags, env)
    except ConfigError as exc:
        if not exit_on_error:
            raise
        _fail(str(exc))
