"""The images install locked, hashed dependencies that match pyproject.toml, before the source.

deploy/docker/requirements-{cpu,cuda}.txt come from `deploy/docker/lock` (pip-compile
--generate-hashes). Every dependency pyproject.toml names is pinned there at a version it
allows and nothing else is a direct dependency; every pin carries sha256 hashes. The
Dockerfiles install the lock with --require-hashes in a layer before any source is copied,
and prepare the model in layers of their own (download, then conversion), also before
the source: a source edit reinstalls nothing and downloads nothing.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from deploy_support import DOCKER, REPO, Stage, dockerfile, requirement_name
from packaging.requirements import Requirement

from service.config import config_from

EXTRAS = {"cpu": (), "cuda": ("cuda",)}  # Dockerfile flavour -> the extras its lock adds
PROJECT = "ladder-serve (pyproject.toml)"


@dataclass
class Pin:
    version: str
    hashes: list[str] = field(default_factory=list)
    via: list[str] = field(default_factory=list)


def read_lock(path: Path) -> dict[str, Pin]:
    """pip-compile's output: `name==version \\`, its `--hash=sha256:...` lines and `# via` comments."""
    pins: dict[str, Pin] = {}
    current: Pin | None = None
    for line in path.read_text().splitlines():
        if pinned := re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line):
            current = pins.setdefault(requirement_name(pinned[1]), Pin(pinned[2]))
        elif current is not None and (digest := re.search(r"--hash=sha256:(\w+)", line)):
            current.hashes.append(digest[1])
        elif current is not None and (via := re.match(r"\s+#\s+(?:via\s*)?(.*)", line)) and via[1]:
            current.via.append(via[1].strip())
    return pins


def lock(flavour: str) -> dict[str, Pin]:
    return read_lock(DOCKER / f"requirements-{flavour}.txt")


def declared(flavour: str) -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = [r for extra in EXTRAS[flavour] for r in project["optional-dependencies"][extra]]
    return [Requirement(r) for r in project["dependencies"] + extras]


def build_stage(flavour: str) -> Stage:
    return dockerfile(flavour).stages[0]


def index_of(stage: Stage, keyword: str, predicate: str) -> int:
    """The position of the first `keyword` instruction whose arguments contain `predicate`."""
    found = [i for i, (kw, args) in enumerate(stage.instructions) if kw == keyword and predicate in args]
    assert found, f"no {keyword} with {predicate!r}"
    return found[0]


@pytest.mark.parametrize("flavour", EXTRAS)
def test_each_lock_pins_every_dependency_pyproject_names_at_a_version_it_allows(flavour: str) -> None:
    pins = lock(flavour)
    for requirement in declared(flavour):
        pin = pins.get(requirement_name(requirement.name))
        assert pin is not None, f"{requirement} is not in requirements-{flavour}.txt: run deploy/docker/lock"
        assert requirement.specifier.contains(pin.version, prereleases=True), (requirement, pin.version)


@pytest.mark.parametrize("flavour", EXTRAS)
def test_each_lock_has_no_direct_dependency_pyproject_does_not_name(flavour: str) -> None:
    direct = {name for name, pin in lock(flavour).items() if PROJECT in pin.via}
    assert direct == {requirement_name(r.name) for r in declared(flavour)}


@pytest.mark.parametrize("flavour", EXTRAS)
def test_every_pin_carries_sha256_hashes(flavour: str) -> None:
    for name, pin in lock(flavour).items():
        assert pin.hashes, f"{name} has no hash"
        assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in pin.hashes), name


def test_the_cuda_lock_is_the_cpu_lock_plus_what_the_cuda_extra_needs() -> None:
    cpu, cuda = lock("cpu"), lock("cuda")
    assert {name: pin.version for name, pin in cpu.items()}.items() <= {
        name: pin.version for name, pin in cuda.items()
    }.items()


def test_the_test_command_pins_every_dependency_and_dev_tool_at_a_version_pyproject_allows() -> None:
    """scripts/test installs with `-c scripts/constraints.txt`: a requirement missing there would float."""
    pins = read_lock(REPO / "scripts/constraints.txt")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for requirement in map(Requirement, project["dependencies"] + project["optional-dependencies"]["dev"]):
        pin = pins.get(requirement_name(requirement.name))
        assert pin is not None, f"{requirement} is not in scripts/constraints.txt (scripts/constraints)"
        assert requirement.specifier.contains(pin.version, prereleases=True), (requirement, pin.version)
    assert "-c scripts/constraints.txt" in (REPO / "scripts/test").read_text()


def test_the_lock_reader_reads_pins_hashes_and_their_reasons(tmp_path: Path) -> None:
    path = tmp_path / "requirements.txt"
    path.write_text(
        "# header\nGrpc_IO==1.2 \\\n    --hash=sha256:" + "a" * 64 + " \\\n"
        "    --hash=sha256:" + "b" * 64 + "\n    # via\n    #   x\n    #   " + PROJECT + "\n"
        "tqdm==4.7 \\\n    --hash=sha256:" + "c" * 64 + "\n    # via gguf\n"
    )
    assert read_lock(path) == {
        "grpc-io": Pin("1.2", ["a" * 64, "b" * 64], ["x", PROJECT]),
        "tqdm": Pin("4.7", ["c" * 64], ["gguf"]),
    }


@pytest.mark.parametrize("flavour", EXTRAS)
def test_each_image_installs_its_lock_with_hashes_before_copying_the_source(flavour: str) -> None:
    stage = build_stage(flavour)
    copy_lock = index_of(stage, "COPY", f"deploy/docker/requirements-{flavour}.txt")
    install = index_of(stage, "RUN", "--require-hashes")
    copy_source = index_of(stage, "COPY", ". .")
    assert copy_lock < install < copy_source
    assert "--no-deps" in stage.instructions[install][1], "the lock is complete: no resolution at build time"
    project_install = (
        index_of(stage, "RUN", "pip install .")
        if flavour == "cpu"
        else index_of(stage, "RUN", "pip install '.[cuda]'")
    )
    assert copy_source < project_install


@pytest.mark.parametrize("flavour", EXTRAS)
def test_each_image_prepares_the_model_in_layers_of_its_own_before_the_source(flavour: str) -> None:
    stage = build_stage(flavour)
    copy_source = index_of(stage, "COPY", ". .")
    download = index_of(stage, "RUN", "fetch_gguf")
    convert = index_of(stage, "RUN", "-m engine.default_model")
    assert download < convert < copy_source
    # Before the source, only the lock and the engine go in; the download sees default_model.py alone.
    early_copies = [args for kw, args in stage.instructions[:copy_source] if kw == "COPY"]
    assert early_copies == [
        f"deploy/docker/requirements-{flavour}.txt /tmp/requirements.txt",
        "engine/__init__.py engine/default_model.py engine/",
        "engine/ engine/",
    ]
    engine_copy = index_of(stage, "COPY", "engine/ engine/")
    assert index_of(stage, "COPY", "engine/default_model.py") < download < engine_copy < convert


@pytest.mark.parametrize("flavour", EXTRAS)
def test_each_image_prepares_the_precision_its_server_picks(flavour: str) -> None:
    # The final stage leaves model_precision at `auto`, which its provider resolves.
    final = dockerfile(flavour).final.env()
    assert "LADDER_MODEL_PRECISION" not in final
    served = config_from({}, {"LADDER_PROVIDER": final["LADDER_PROVIDER"]}).default_model_precision
    assert build_stage(flavour).env()["LADDER_MODEL_PRECISION"] == served


def test_the_build_context_carries_the_locks_and_nothing_else_of_deploy() -> None:
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def ignored(path: str) -> bool:
        verdict = False  # as docker reads it: the last pattern that matches decides
        for pattern in patterns:
            negated = pattern.startswith("!")
            bare = pattern.lstrip("!")
            if Path(path).match(bare) or path.startswith(bare + "/"):
                verdict = not negated
        return verdict

    assert not ignored("deploy/docker/requirements-cpu.txt")
    assert not ignored("deploy/docker/requirements-cuda.txt")
    assert ignored("deploy/docker/Dockerfile.cpu") and ignored("deploy/k8s/base/pdb.yaml")
