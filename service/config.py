"""The one typed configuration object, built once from flags and the environment.

This module is the only place Ladder reads the environment, the seed's
ONNX_GENAI_PREFILL_QUERY_PADDING=0 switch included. Everything else receives
a frozen Config (or the EngineOptions derived from it) explicitly.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from engine.executor.options import EngineOptions

PADDING_SWITCH = "ONNX_GENAI_PREFILL_QUERY_PADDING"


def padding_enabled(env: Mapping[str, str]) -> bool:
    """Padding is on unless the seed's switch says 0 (or false/off/no)."""
    value = env.get(PADDING_SWITCH, "1").strip().lower()
    return value not in {"0", "false", "off", "no"}


@dataclass(frozen=True)
class Config:
    padding: bool = True
    provider: str = "cpu"
    variant_capacity: int = 4
    max_sessions: int = 8

    def engine_options(self) -> EngineOptions:
        return EngineOptions(provider=self.provider, padding=self.padding,
                             variant_capacity=self.variant_capacity,
                             max_sessions=self.max_sessions)


def load_config(env: Mapping[str, str] | None = None) -> Config:
    """Build the Config from the environment (os.environ unless one is given)."""
    source = os.environ if env is None else env
    return Config(padding=padding_enabled(source))
