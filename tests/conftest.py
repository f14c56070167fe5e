"""Shared fixtures: generated model directories, built once per test run."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import structlog

from engine.modelgen.builder import DecoderSpec
from engine.modelgen.synthetic import VARIANTS, build_synthetic

# In-process servers log every call (access lines; forwards at debug level). Their lines go to the
# process's own stderr, which pytest reports with a failing test, never into what capsys reads.
structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.__stderr__))


@pytest.fixture(scope="session")
def synthetic_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("synthetic")


@pytest.fixture(scope="session")
def model_dir(synthetic_root: Path) -> Callable[..., Path]:
    """Build (once) the generated decoder named `variant` and return its directory."""

    def build(variant: str = "plain", spec: DecoderSpec | None = None, **kwargs: int) -> Path:
        return build_synthetic(spec or VARIANTS[variant], synthetic_root, **kwargs)

    return build
