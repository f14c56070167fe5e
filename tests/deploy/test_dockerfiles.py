"""The images install and start Ladder exactly as the README and the manifests say.

No docker engine runs in CI, so the Dockerfiles are read, not built: the install
step must be the README's own pip command (followed into the scripts its shell
blocks run; editable or not and pip's verbosity aside), the entrypoint
`ladder serve`, the user non-root and the exposed ports the server's defaults.
"""

from __future__ import annotations

import fnmatch
import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from deploy_support import (
    DOCKER,
    REPO,
    Dockerfile,
    PipInstall,
    dockerfile,
    main_container,
    one,
    overlay,
    parse_dockerfile,
    pip_install,
    pip_installs,
    readme_pip_installs,
    readme_serving_install,
    requirement_name,
    shell_commands,
    third_party_imports,
)

FLAVOURS = {"cpu": "cpu", "cuda": "gpu"}  # Dockerfile flavour -> k8s overlay
DEFAULT_GRPC_PORT, DEFAULT_METRICS_PORT, DEFAULT_HTTP_PORT = 50051, 9464, 8000


def image_install(flavour: str) -> PipInstall:
    """The image's install of the project itself (there must be exactly one)."""
    installs = [s for s in dockerfile(flavour).pip_installs() if s.project_extras() is not None]
    assert len(installs) == 1, f"Dockerfile.{flavour} should install the project once: {installs}"
    return installs[0]


def test_the_cpu_image_installs_ladder_exactly_as_the_readme_does():
    readme = REPO / "README.md"
    assert readme.is_file(), "README.md is missing: the images must install as it says"
    assert image_install("cpu") == readme_serving_install(readme)


def no_deps(install: PipInstall) -> PipInstall:
    return PipInstall(install.requirements, (*install.options, "--no-deps"))


def test_the_cuda_image_installs_what_the_readme_does_plus_the_cuda_extra_without_dependencies():
    # Plus --no-deps: its lock layer installed every dependency but the CPU onnxruntime, which
    # the base dependencies name and which would hide the CUDA provider (the test below).
    readme = REPO / "README.md"
    assert readme.is_file(), "README.md is missing: the images must install as it says"
    serving = readme_serving_install(readme)
    assert image_install("cuda") == no_deps(serving.with_extra("cuda"))
    # Where the README spells the GPU install out, it is that one exactly (plus --no-deps).
    shown = [s for s in readme_pip_installs(readme) if "cuda" in (s.project_extras() or ())]
    assert all(image_install("cuda") == no_deps(s) for s in shown), shown


def test_the_image_install_provides_every_module_serving_and_model_preparation_import():
    # The images only `pip install .` (+ cuda): whatever `ladder serve` and
    # `ladder model prepare` (run at build time) import must come with it.
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = {requirement_name(r) for r in project["dependencies"]}
    cuda = {requirement_name(r) for r in project["optional-dependencies"]["cuda"]}
    providers = importlib.metadata.packages_distributions()
    missing = []
    for module, importers in sorted(
        third_party_imports("clients.python.cli", "service.server", "engine.default_model").items()
    ):
        allowed = base | cuda if all(".cuda" in m for m in importers) else base
        if module in providers:
            provided = {requirement_name(d) for d in providers[module]} & allowed
        else:  # not installed here (cupy without a GPU): match names like cupy-cuda13x
            provided = {d for d in allowed if d == module or d.startswith(module + "-")}
        if not provided:
            missing.append(f"{module} (imported by {', '.join(sorted(importers))})")
    assert missing == [], (
        "pyproject [project].dependencies lacks what these imports need, so the images' "
        f"`pip install .` cannot run `ladder model prepare`/`ladder serve`: {missing}"
    )


def pinned(lock_text: str) -> dict[str, list[str]]:
    """A pip-compile lock's entries: each pin's name and its lines (the pin, its hashes, its `# via`)."""
    entries: dict[str, list[str]] = {}
    lines: list[str] | None = None
    for line in lock_text.splitlines():
        if pin := re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==", line):
            lines = entries.setdefault(requirement_name(pin[1]), [])
        if lines is not None:
            lines.append(line)
    return entries


def requirement_files(command: list[str]) -> list[str]:
    """The files a `pip install` command installs from (`-r FILE`, `--requirement FILE`)."""
    return [command[i + 1] for i, token in enumerate(command[:-1]) if token in {"-r", "--requirement"}]


def copied_to(stage_instructions: list[tuple[str, str]]) -> dict[str, str]:
    """Where each single-file COPY from the build context put a repository file: target -> source."""
    targets = {}
    for keyword, args in stage_instructions:
        words = args.split()
        if keyword == "COPY" and len(words) == 2 and not words[0].startswith("--"):
            targets[words[1]] = words[0]
    return targets


def test_the_cuda_image_installs_only_the_gpu_build_of_onnxruntime_from_its_lock_with_hashes():
    # The base dependencies name the CPU onnxruntime, the cuda extra onnxruntime-gpu: both
    # wheels write one package directory, where the CPU build hides the CUDA provider. The lock
    # layer installs every pin of the cuda lock but the CPU build's (its awk filter, run here on
    # the real lock), hashes and all, checks the provider, and nothing later installs or removes one.
    build = dockerfile("cuda").stages[0]
    run = next(args for kw, args in build.instructions if kw == "RUN" and "--require-hashes" in args)
    commands = shell_commands(run)
    (awk,) = [c for c in commands if c[0] == "awk"]
    (install,) = [c for c in commands if pip_install(c) is not None]
    lock_in_image = awk[-1]
    lock = REPO / copied_to(build.instructions)[lock_in_image]
    assert lock == DOCKER / "requirements-cuda.txt"
    (installed,) = requirement_files(install)
    assert re.search(rf"{re.escape(lock_in_image)}\s*>\s*{re.escape(installed)}(\s|$)", run), (
        "pip must install what the filter wrote"
    )
    assert "--require-hashes" in install and "--no-deps" in install
    filtered = subprocess.run([*awk[:-1], str(lock)], capture_output=True, text=True, check=True).stdout
    locked = pinned(lock.read_text())
    assert "onnxruntime" in locked and "onnxruntime-gpu" in locked
    assert pinned(filtered) == {name: lines for name, lines in locked.items() if name != "onnxruntime"}
    assert any("--hash=sha256:" in line for line in pinned(filtered)["onnxruntime-gpu"])
    assert "CUDAExecutionProvider" in run, "the build must fail without the CUDA provider"
    assert "--no-deps" in image_install("cuda").options, (
        "without it pip fetches the CPU build for the base dependencies"
    )
    for flavour in FLAVOURS:
        runs = [r for s in dockerfile(flavour).stages for r in s.all("RUN")]
        assert all("uninstall" not in r and "--force-reinstall" not in r for r in runs), flavour


def copies_the_source(args: str) -> bool:
    """A COPY of the build context's root (`COPY . .`), not of single paths nor from another stage."""
    words = args.split()
    sources = [w for w in words[:-1] if not w.startswith("--")]
    return not any(w.startswith("--from") for w in words) and any(s in {".", "./"} for s in sources)


def locked_before(instructions: list[tuple[str, str]]) -> set[str]:
    """Names pinned in a lock that a RUN among `instructions` installs as it was copied in."""
    copied = copied_to(instructions)
    names: set[str] = set()
    for keyword, args in instructions:
        for command in shell_commands(args) if keyword == "RUN" else []:
            for path in requirement_files(command) if pip_install(command) else []:
                if path in copied:
                    names |= set(pinned((REPO / copied[path]).read_text()))
    return names


def declared(extras: frozenset[str]) -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + [
        r for extra in sorted(extras) for r in project["optional-dependencies"][extra]
    ]
    return {requirement_name(r) for r in requirements}


def dependency_changes(run: str, locked: set[str]) -> list[str]:
    """The commands of a RUN that install or remove a package other than Ladder itself.

    Ladder's own install counts unless it is --no-deps or a lock that an earlier layer
    installed verbatim pins every dependency it names (`locked`): else pip resolves some.
    """
    changes = []
    for command in shell_commands(run):
        names = [Path(t).name for t in command]
        pairs = set(zip(names, names[1:], strict=False))
        spec = pip_install(command)
        if pairs & {("pip", "uninstall"), ("pip3", "uninstall"), ("apt-get", "install"), ("apt", "install")}:
            changes.append(" ".join(command))
        elif spec is not None:
            extras = spec.project_extras()
            others = [r for r in spec.requirements if PipInstall((r,)).project_extras() is None]
            resolves = (
                extras is not None and "--no-deps" not in spec.options and not (declared(extras) <= locked)
            )
            if others or requirement_files(command) or resolves:
                changes.append(" ".join(command))
    return changes


def late_dependency_installs(image: Dockerfile) -> list[str]:
    """The commands, in RUNs after a stage's first copy of the source tree, that install or
    remove a dependency: a source edit re-runs them, downloads included."""
    late = []
    for stage in image.stages:
        copies = [
            i for i, (kw, args) in enumerate(stage.instructions) if kw == "COPY" and copies_the_source(args)
        ]
        if copies:
            locked = locked_before(stage.instructions[: copies[0]])
            late += [
                change
                for kw, args in stage.instructions[copies[0] + 1 :]
                if kw == "RUN"
                for change in dependency_changes(args, locked)
            ]
    return late


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_every_run_that_installs_a_dependency_comes_before_the_first_copy_of_the_source(flavour):
    image = dockerfile(flavour)
    assert any(copies_the_source(a) for s in image.stages for a in s.all("COPY")), "no `COPY . .`"
    assert late_dependency_installs(image) == [], (
        f"Dockerfile.{flavour}: these run again on every source edit; install them before `COPY . .`"
    )


def test_the_layer_check_catches_every_way_a_dependency_gets_in_after_the_source(tmp_path):
    # The CUDA image as it was (its onnxruntime swap after the source), and other late installs.
    path = tmp_path / "Dockerfile"
    path.write_text(
        "FROM python:3.12-slim AS build\n"
        "COPY deploy/docker/requirements-cuda.txt /tmp/requirements.txt\n"
        "RUN pip install --require-hashes --no-deps -r /tmp/requirements.txt\n"
        "COPY engine/ engine/\n"
        "COPY . .\n"
        "RUN pip install '.[cuda]'\n"
        "RUN gpu=\"$(pip freeze | grep -i '^onnxruntime-gpu==')\" \\\n"
        " && pip uninstall -y onnxruntime \\\n"
        ' && pip install --force-reinstall --no-deps "$gpu"\n'
        "RUN apt-get update && apt-get install -y curl\n"
        "RUN python -m pip install -q -r requirements-dev.txt\n"
        "RUN pip install '.[cuda,dev]'\n"
        "RUN ladder model prepare\n"
        "FROM python:3.12-slim\n"
        "RUN pip install grpcio\n"
        "COPY --from=build /opt/ladder /opt/ladder\n"
        "RUN pip install structlog\n"
    )
    assert late_dependency_installs(parse_dockerfile(path)) == [
        "pip uninstall -y onnxruntime",
        "pip install --force-reinstall --no-deps $gpu",
        "apt-get install -y curl",
        "python -m pip install -q -r requirements-dev.txt",
        "pip install .[cuda,dev]",
    ]
    # A filtered lock vouches for nothing: Ladder's own install after it must be --no-deps.
    path.write_text(
        "FROM python:3.12-slim\n"
        "COPY deploy/docker/requirements-cuda.txt /tmp/requirements.txt\n"
        "RUN grep -v '^onnxruntime==' /tmp/requirements.txt > /tmp/r.txt && pip install -r /tmp/r.txt\n"
        "COPY . .\n"
        "RUN pip install '.[cuda]'\n"
        "RUN pip install --no-deps '.[cuda]'\n"
    )
    assert late_dependency_installs(parse_dockerfile(path)) == ["pip install .[cuda]"]


def test_the_readme_is_read_in_order_from_its_shell_blocks_and_the_scripts_they_run(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(
        "Install with `pip install nothing-inline`.\n\n"
        "```bash\npython -m venv .venv && . .venv/bin/activate\n"
        "pip install -e '.[dev]'\npip install --no-cache-dir .  # serve\n```\n\n"
        "```python\n# pip install not-shell\n```\n\n"
        "```console\n$ pip install '.[cuda]'\n$ ./scripts/test\n```\n"
    )
    assert readme_pip_installs(readme)[:3] == [
        PipInstall((".[dev]",)),
        PipInstall((".",)),
        PipInstall((".[cuda]",)),
    ]
    # scripts/test installs the dev extra (at its constraints' versions): followed into, but never the
    # serving install.
    dev = PipInstall((".[dev]",), ("--constraint=scripts/constraints.txt",))
    assert dev in readme_pip_installs(readme)[3:]
    assert readme_serving_install(readme) == PipInstall((".",))


def test_pip_commands_compare_by_what_they_install_not_how_they_are_spelled():
    quiet = "python -m pip install --no-cache-dir -q --progress-bar off '.[cuda]'"
    assert pip_installs(quiet) == [PipInstall((".[cuda]",))]
    assert pip_installs("$ .venv/bin/pip install \\\n  -e '.[dev,cuda]'") == [PipInstall((".[cuda,dev]",))]
    constrained = [PipInstall((".[dev]",), ("--constraint=c.txt",))]
    assert pip_installs("pip install -c c.txt -e '.[dev]'") == constrained
    assert pip_installs("pip install --constraint c.txt '.[dev]'") == constrained
    assert pip_installs("cd x && pip3 install . # CPU") == [PipInstall((".",))]
    assert pip_installs("uv pip install --pre .") == [PipInstall((".",), ("--pre",))]
    assert pip_installs('if ! run pip install -e . >"$LOG" 2>&1; then') == [PipInstall((".",))]
    assert pip_installs("pip install '.[cuda]'") != pip_installs("pip install .")
    assert PipInstall((".",)).with_extra("cuda") == PipInstall((".[cuda]",))


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_each_image_runs_ladder_serve_as_its_entrypoint(flavour):
    assert dockerfile(flavour).entrypoint_command() == ["ladder", "serve"]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_each_image_runs_as_the_non_root_uid_the_pod_requires(flavour):
    users = dockerfile(flavour).final.all("USER")
    assert users, f"Dockerfile.{flavour} final stage has no USER"
    uid = users[-1].split(":")[0]
    assert uid not in {"root", "0"}
    pod = one(overlay(FLAVOURS[flavour]), "Deployment")["spec"]["template"]["spec"]
    assert int(uid) == pod["securityContext"]["runAsUser"]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_each_image_exposes_the_default_ports_the_pod_declares(flavour):
    assert dockerfile(flavour).exposed_ports() == {DEFAULT_GRPC_PORT, DEFAULT_METRICS_PORT, DEFAULT_HTTP_PORT}
    container = main_container(one(overlay(FLAVOURS[flavour]), "Deployment"))
    assert {p["containerPort"] for p in container["ports"]} == {
        DEFAULT_GRPC_PORT,
        DEFAULT_METRICS_PORT,
        DEFAULT_HTTP_PORT,
    }


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_the_default_model_is_prepared_at_build_time_into_the_cache_the_image_uses(flavour):
    image = dockerfile(flavour)
    builds = [s for s in image.stages if any("ladder model prepare" in r for r in s.all("RUN"))]
    assert builds, f"Dockerfile.{flavour} never runs `ladder model prepare`"
    cache = builds[0].env()["LADDER_MODEL_CACHE"]
    assert image.final.env()["LADDER_MODEL_CACHE"] == cache
    assert any(cache.startswith(c.split()[-1]) for c in image.final.all("COPY"))


def test_the_cpu_image_is_slim_python_and_the_cuda_image_is_a_cuda_13_runtime():
    assert {s.base for s in dockerfile("cpu").stages} <= {"python:3.11-slim", "python:3.12-slim"}
    for stage in dockerfile("cuda").stages:
        assert stage.base.startswith("nvidia/cuda:13."), stage.base
        assert "runtime" in stage.base, stage.base
    assert dockerfile("cuda").final.env()["LADDER_PROVIDER"] == "cuda"


def test_the_build_context_keeps_what_pip_needs_and_drops_local_state():
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def ignored(path: str) -> bool:
        return any(fnmatch.fnmatch(path, p) or path.startswith(p + "/") for p in patterns)

    for needed in ("pyproject.toml", "README.md", "engine", "service", "clients", "proto"):
        assert not ignored(needed), f".dockerignore drops {needed}, which `pip install .` needs"
    for local in (".git", ".venv", ".venv/bin/python", ".pytest_cache"):
        assert ignored(local), f".dockerignore should drop {local}"


@pytest.fixture
def health_server():
    """A bare grpc.health.v1 server on a free port, its statuses set by the test."""
    from grpc_health.v1 import health, health_pb2_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, port
    server.stop(None)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_the_docker_healthcheck_passes_only_while_the_server_says_serving(flavour, health_server):
    from grpc_health.v1 import health_pb2

    servicer, port = health_server
    interpreter, *args = dockerfile(flavour).healthcheck_command()
    assert interpreter == "python"
    env = {**os.environ, "LADDER_PORT": str(port)}

    def healthcheck() -> int:
        return subprocess.run([sys.executable, *args], env=env, capture_output=True, timeout=30).returncode

    servicer.set("ladder.v1.Ladder", health_pb2.HealthCheckResponse.SERVING)
    assert healthcheck() == 0
    servicer.set("ladder.v1.Ladder", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert healthcheck() != 0
    readiness = main_container(one(overlay(FLAVOURS[flavour]), "Deployment"))["readinessProbe"]
    assert f"service='{readiness['grpc']['service']}'" in args[-1], "same service as the kubelet"
