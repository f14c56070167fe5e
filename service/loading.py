"""Loading the model a Config names: the engine (warmed up when asked) and its tokenizer, if any.

Import this module on the main thread, as service/server.py does: onnxruntime-extensions' native
module has aborted the process when first imported from the model-loading thread, so
engine.tokenizer is imported here, with this module.
"""

from __future__ import annotations

import time
from pathlib import Path

import structlog

import engine.tokenizer  # noqa: F401 — at import, on the main thread: see above
from engine.executor.engine import load_engine
from service.config import Config
from service.limits import host_memory_free_bytes
from service.served_model import ModelSpec, ServedModel, read_tokenizer

log = structlog.get_logger("ladder.server")


def load_model(config: Config) -> ServedModel:
    """The engine and tokenizer of config.model ("default": prepared under config.model_cache)."""
    if config.model == "default":
        from engine.default_model import prepare

        path = prepare(Path(config.model_cache), precision=config.default_model_precision).model_dir
    else:
        path = Path(config.model)
    engine = load_engine(path, config.engine_options())
    if config.warm_up:
        started = time.perf_counter()
        prepared = engine.warm_up()
        log.info("warmed_up", variants=prepared, seconds=round(time.perf_counter() - started, 3))
    names = (config.served_model_name or path.name, str(path), config.model)
    limits = (config.max_prompt_tokens, config.max_new_tokens, config.default_max_new_tokens)
    api_names = tuple(dict.fromkeys(name for name in names if name))
    model = ServedModel(engine, read_tokenizer(path), ModelSpec(engine.facts, str(path), *limits, api_names))
    model.draft_tokens = config.speculation(engine.kernels.speculation_exact) if engine.verifies else 0
    log.info("speculation", draft_tokens=model.draft_tokens, verify_gap=engine.kernels.verify_gap)
    model.session_memory, on_device = session_memory_bytes(config, engine.backend.free_device_bytes())
    engine.limit_parked_on_device(on_device)
    engine.limit_parked(model.session_memory or None)
    return model


def session_memory_bytes(config: Config, free_device: int | None) -> tuple[int, int | None]:
    """What parked sessions may hold (--session-memory-mb; 0 = parking off), and how much of it stays
    in device memory (--session-device-memory-mb; None where parked KV lives on the host), the rest
    spilling to pinned host memory. Auto: half the memory free now that the model is loaded and
    warm: the host's (within a cgroup's limit), plus half the device's (`free_device`)."""
    device = None
    if free_device is not None:
        mb = config.session_device_memory_mb
        device = free_device // 2 if mb is None else mb << 20
    if config.session_memory_mb is not None:
        return config.session_memory_mb << 20, device
    return host_memory_free_bytes() // 2 + (device or 0), device
