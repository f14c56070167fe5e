"""The one typed configuration object, built once from flags and the environment.

This module is the only place Ladder reads the environment, the seed's
ONNX_GENAI_PREFILL_QUERY_PADDING=0 switch included. Every setting has a flag
(`--max-sessions`) and an environment variable (`LADDER_MAX_SESSIONS`); a flag
wins over the environment, the environment over the default. Everything else
receives a frozen Config (or the EngineOptions derived from it) explicitly.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from engine.executor.options import EngineOptions

PADDING_SWITCH = "ONNX_GENAI_PREFILL_QUERY_PADDING"
ENV_PREFIX = "LADDER_"
_FALSE = {"0", "false", "off", "no"}


def padding_enabled(env: Mapping[str, str]) -> bool:
    """Padding is on unless the seed's switch says 0 (or false/off/no)."""
    value = env.get(PADDING_SWITCH, "1").strip().lower()
    return value not in _FALSE


def default_model_cache(env: Mapping[str, str]) -> str:
    """Where the default model is prepared: $XDG_CACHE_HOME/ladder, else ~/.cache/ladder."""
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "ladder")


@dataclass(frozen=True)
class Config:
    host: str = "[::]"
    port: int = 50051
    metrics_port: int = 9090  # 0 = no metrics endpoint
    model: str = "default"  # a model directory, or "default" (prepared under model_cache)
    model_cache: str = ""
    model_precision: str = "fp32"  # weights of the default model: fp32 | int4 (MatMulNBits)
    model_read_only: bool = False  # never rewrite the model's graph (its head then runs on every row)
    provider: str = "cpu"  # cpu | cuda
    padding: bool = True
    chunk_size: int | None = None  # override the model's chunk width; 0 = no chunking
    capacity: int | None = None  # KV capacity per session; None = the model's max length
    variant_capacity: int = 0  # 0 = every planned shape: the prefill ladder + the decode batch widths
    max_sessions: int = 8
    warm_up: bool = True  # prepare every planned shape (graph captures on CUDA) before serving
    lookahead: bool = True  # CUDA: launch the next decode forward before its tokens are read
    memory_budget_mb: int = 0  # weights + KV + variants; the pool holds as many KV slots as fit
    max_queue: int = 64  # requests the engine worker holds at once
    session_idle_seconds: float = 300.0
    drain_seconds: float = 20.0
    max_prompt_tokens: int = 0  # 0 = the KV capacity
    max_new_tokens: int = 1024  # the most one request may ask for
    max_message_bytes: int = 4 * 1024 * 1024
    sessions_per_caller: int = 0  # 0 = every KV slot but one (at least one): a fair share
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""  # set: clients must present a certificate it signed (mTLS)
    auth_tokens: tuple[str, ...] = ()  # bearer tokens; "name=token" names the caller
    pod_name: str = ""
    intra_op_threads: int = 0
    log_level: str = "info"

    def engine_options(self) -> EngineOptions:
        return EngineOptions(provider=self.provider, padding=self.padding, chunk_size=self.chunk_size,
                             capacity=self.capacity, variant_capacity=self.variant_capacity,
                             max_sessions=self.max_sessions, intra_op_threads=self.intra_op_threads,
                             memory_budget_bytes=self.memory_budget_mb << 20, lookahead=self.lookahead,
                             graph_read_only=self.model_read_only,
                             graph_cache=Path(self.model_cache) / "graphs" if self.model_cache else None)

    @property
    def tls(self) -> bool:
        return bool(self.tls_cert and self.tls_key)

    @property
    def auth(self) -> bool:
        return bool(self.auth_tokens)


_HELP = {
    "host": "address to listen on", "port": "gRPC port (0 = any free port)",
    "metrics_port": "Prometheus /metrics port (0 = off)", "model": 'model directory or "default"',
    "model_cache": "cache directory of the default model (and of rewritten copies of model graphs)",
    "model_read_only": "never rewrite the model's graph: its lm-head then runs on every prefill row",
    "model_precision": "weights of the default model: fp32 or int4 (faster decode, less memory)",
    "provider": "execution provider: cpu | cuda",
    "padding": "query-axis padding of prefill forwards (also ONNX_GENAI_PREFILL_QUERY_PADDING)",
    "auth_tokens": "comma-separated bearer tokens (name=token names the caller)",
    "memory_budget_mb": "weights + KV + variants limit: the KV slots are as many as it holds (0 = off)",
    "pod_name": "prefix of session ids (defaults to the host name)",
    "warm_up": "prepare every ladder and batch width (CUDA graphs) before health turns SERVING",
    "lookahead": "CUDA: launch the next decode forward on the chosen tokens before the host reads them",
    "variant_capacity": "shapes the variant cache holds (0 = the ladder widths + the decode batch widths)",
    "max_sessions": "KV slots: sessions held at once, and the widest decode batch",
    "max_queue": "requests the engine worker holds, running or waiting for a slot (more: RESOURCE_EXHAUSTED)",
    "sessions_per_caller": "sessions one caller may hold, those it waits for too (0 = every KV slot but one)",
}


def _parse(name: str, text: object) -> object:
    """One setting's value from its flag or environment text (typed values pass as they are)."""
    if not isinstance(text, str):
        return tuple(text) if isinstance(text, list) else text
    kind = {f.name: str(f.type) for f in fields(Config)}[name]
    if name == "auth_tokens":
        return tuple(t.strip() for t in text.split(",") if t.strip())
    if kind == "bool":
        return text.strip().lower() not in _FALSE
    if kind == "int | None":
        return None if text.strip().lower() in {"", "none", "auto"} else int(text)
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    return text


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Add one --flag per Config field (defaults None: unset flags fall through to the environment)."""
    parser = parser or argparse.ArgumentParser(prog="ladder serve", description="Serve a model over gRPC.")
    for field in fields(Config):
        flag = "--" + field.name.replace("_", "-")
        env = ENV_PREFIX + field.name.upper()
        parser.add_argument(flag, dest=field.name, default=None, metavar=field.name.upper(),
                            help=f"{_HELP.get(field.name, field.name.replace('_', ' '))} [env {env}]")
    return parser


def config_from(flags: Mapping[str, object], env: Mapping[str, str] | None = None) -> Config:
    """Flags (None = unset; other keys ignored) over LADDER_* env (default os.environ) over defaults."""
    env = os.environ if env is None else env
    values: dict[str, object] = {}
    for field in fields(Config):
        text = flags.get(field.name)
        if text is None:
            text = env.get(ENV_PREFIX + field.name.upper())
        if text is not None:
            values[field.name] = _parse(field.name, text)
    if "padding" not in values:
        values["padding"] = padding_enabled(env)
    values.setdefault("model_cache", default_model_cache(env))
    values.setdefault("pod_name", socket.gethostname().split(".")[0])
    config = Config(**values)  # type: ignore[arg-type]
    validate(config)
    return config


def validate(config: Config) -> None:
    """Raise ValueError for settings that cannot work together."""
    if config.provider not in {"cpu", "cuda"}:
        raise ValueError(f"provider must be cpu or cuda, got {config.provider!r}")
    if config.model_precision not in {"fp32", "int4"}:
        raise ValueError(f"model_precision must be fp32 or int4, got {config.model_precision!r}")
    if bool(config.tls_cert) != bool(config.tls_key):
        raise ValueError("TLS needs both tls_cert and tls_key")
    if config.tls_client_ca and not config.tls:
        raise ValueError("tls_client_ca (mutual TLS) needs tls_cert and tls_key")
    if "." in config.pod_name:
        raise ValueError("pod_name may not contain '.': it separates the pod from the session token")
    for name in ("max_sessions", "max_queue", "max_new_tokens", "max_message_bytes"):
        if getattr(config, name) < 1:
            raise ValueError(f"{name} must be >= 1")


def load_config(env: Mapping[str, str] | None = None, argv: Sequence[str] | None = None) -> Config:
    """Build the Config from flags (none unless argv is given) and the environment (os.environ by default)."""
    flags = vars(build_parser().parse_args(list(argv or [])))
    return config_from(flags, env)
