"""The engine's state machine: one `Engine.step` per scheduler round, its sessions, the prefill and
decode forwards it plans, rewind and fork, the self-check and the prefix holders.

It runs forwards through a `Backend` (engine/runtime/: the only code that touches onnxruntime and
cupy) and never imports onnxruntime itself. `Engine` (engine/executor/engine.py) is imported from
its own module, by what builds one (service/loading.py, tests, bench); the rest of the product
drives an engine through `Driven` (engine/executor/step.py)."""

from engine.executor.prefill import ForwardReport, PrefillTask
from engine.executor.session import Session, SessionStats
from engine.executor.stats import DecodeStats, EngineStats
from engine.executor.step import DecodeRow, Step, StepResult
from engine.options import EngineOptions
from engine.runtime.variants import VariantCache, VariantKey, VariantStats

__all__ = [
    "DecodeRow",
    "Step",
    "StepResult",
    "DecodeStats",
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
