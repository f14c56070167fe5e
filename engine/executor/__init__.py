"""The executor: the only code that touches onnxruntime (and, on CUDA, cupy)."""

from engine.executor.engine import Engine, EngineStats
from engine.executor.options import EngineOptions
from engine.executor.session import ForwardReport, Session, SessionStats
from engine.executor.variants import VariantCache, VariantKey, VariantStats

__all__ = [
    "Engine",
    "EngineOptions",
    "EngineStats",
    "ForwardReport",
    "Session",
    "SessionStats",
    "VariantCache",
    "VariantKey",
    "VariantStats",
]
