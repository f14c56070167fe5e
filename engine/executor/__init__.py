"""The executor: the only code that touches onnxruntime (and, on CUDA, cupy)."""

from engine.executor.engine import Engine
from engine.executor.options import EngineOptions
from engine.executor.prefill import ForwardReport, PrefillTask
from engine.executor.session import Session, SessionStats
from engine.executor.stats import DecodeStats, EngineStats
from engine.executor.step import DecodeRow, Step, StepResult
from engine.executor.variants import VariantCache, VariantKey, VariantStats

__all__ = [
    "DecodeRow",
    "Step",
    "StepResult",
    "DecodeStats",
    "Engine",
    "EngineOptions",
    "EngineStats",
    "ForwardReport",
    "PrefillTask",
    "Session",
    "SessionStats",
    "VariantCache",
    "VariantKey",
    "VariantStats",
]
