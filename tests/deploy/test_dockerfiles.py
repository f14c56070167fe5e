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
import subprocess
import sys
import tomllib
from concurrent import futures

import grpc
import pytest
from deploy_support import (
    REPO,
    PipInstall,
    dockerfile,
    main_container,
    one,
    overlay,
    pip_installs,
    readme_pip_installs,
    readme_serving_install,
    requirement_name,
    third_party_imports,
)

FLAVOURS = {"cpu": "cpu", "cuda": "gpu"}  # Dockerfile flavour -> k8s overlay
DEFAULT_GRPC_PORT, DEFAULT_METRICS_PORT = 50051, 9464


def image_install(flavour: str) -> PipInstall:
    """The image's install of the project itself (there must be exactly one)."""
    installs = [s for s in dockerfile(flavour).pip_installs() if s.project_extras() is not None]
    assert len(installs) == 1, f"Dockerfile.{flavour} should install the project once: {installs}"
    return installs[0]


def test_the_cpu_image_installs_ladder_exactly_as_the_readme_does():
    readme = REPO / "README.md"
    assert readme.is_file(), "README.md is missing: the images must install as it says"
    assert image_install("cpu") == readme_serving_install(readme)


def test_the_cuda_image_installs_what_the_readme_does_plus_the_cuda_extra():
    readme = REPO / "README.md"
    assert readme.is_file(), "README.md is missing: the images must install as it says"
    serving = readme_serving_install(readme)
    assert image_install("cuda") == serving.with_extra("cuda")
    # Where the README spells the GPU install out, it is that one exactly.
    shown = [s for s in readme_pip_installs(readme) if "cuda" in (s.project_extras() or ())]
    assert all(image_install("cuda") == s for s in shown), shown


def test_the_image_install_provides_every_module_serving_and_model_preparation_import():
    # The images only `pip install .` (+ cuda): whatever `ladder serve` and
    # `ladder model prepare` (run at build time) import must come with it.
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = {requirement_name(r) for r in project["dependencies"]}
    cuda = {requirement_name(r) for r in project["optional-dependencies"]["cuda"]}
    providers = importlib.metadata.packages_distributions()
    missing = []
    for module, importers in sorted(third_party_imports(
            "clients.python.cli", "service.server", "engine.default_model").items()):
        allowed = base | cuda if all(".cuda" in m for m in importers) else base
        if module in providers:
            provided = {requirement_name(d) for d in providers[module]} & allowed
        else:  # not installed here (cupy without a GPU): match names like cupy-cuda13x
            provided = {d for d in allowed if d == module or d.startswith(module + "-")}
        if not provided:
            missing.append(f"{module} (imported by {', '.join(sorted(importers))})")
    assert missing == [], (
        "pyproject [project].dependencies lacks what these imports need, so the images' "
        f"`pip install .` cannot run `ladder model prepare`/`ladder serve`: {missing}")


def test_the_cuda_image_keeps_only_the_gpu_build_of_onnxruntime():
    # `pip install '.[cuda]'` installs onnxruntime and onnxruntime-gpu into one
    # package directory; the CPU build wins and the CUDA provider disappears.
    runs = [r for s in dockerfile("cuda").stages for r in s.all("RUN")]
    project = next(i for i, r in enumerate(runs) if "pip install '.[cuda]'" in r)
    fixup = next(r for r in runs[project + 1:] if "pip uninstall -y onnxruntime" in r)
    assert "--force-reinstall --no-deps" in fixup and "onnxruntime-gpu" in fixup
    assert "CUDAExecutionProvider" in fixup, "the build must fail without the CUDA provider"
    assert all("uninstall" not in r for r in
               [r for s in dockerfile("cpu").stages for r in s.all("RUN")])


def test_the_readme_is_read_in_order_from_its_shell_blocks_and_the_scripts_they_run(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(
        "Install with `pip install nothing-inline`.\n\n"
        "```bash\npython -m venv .venv && . .venv/bin/activate\n"
        "pip install -e '.[dev]'\npip install --no-cache-dir .  # serve\n```\n\n"
        "```python\n# pip install not-shell\n```\n\n"
        "```console\n$ pip install '.[cuda]'\n$ ./scripts/test\n```\n")
    assert readme_pip_installs(readme)[:3] == [
        PipInstall((".[dev]",)), PipInstall((".",)), PipInstall((".[cuda]",))]
    # scripts/test installs the dev extra: followed into, but never the serving install.
    assert PipInstall((".[dev]",)) in readme_pip_installs(readme)[3:]
    assert readme_serving_install(readme) == PipInstall((".",))


def test_pip_commands_compare_by_what_they_install_not_how_they_are_spelled():
    quiet = "python -m pip install --no-cache-dir -q --progress-bar off '.[cuda]'"
    assert pip_installs(quiet) == [PipInstall((".[cuda]",))]
    assert pip_installs("$ .venv/bin/pip install \\\n  -e '.[dev,cuda]'") == [
        PipInstall((".[cuda,dev]",))]
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
    assert dockerfile(flavour).exposed_ports() == {DEFAULT_GRPC_PORT, DEFAULT_METRICS_PORT}
    container = main_container(one(overlay(FLAVOURS[flavour]), "Deployment"))
    assert {p["containerPort"] for p in container["ports"]} == {
        DEFAULT_GRPC_PORT, DEFAULT_METRICS_PORT}


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
    patterns = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]

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
        return subprocess.run([sys.executable, *args], env=env, capture_output=True,
                              timeout=30).returncode

    servicer.set("ladder.v1.Ladder", health_pb2.HealthCheckResponse.SERVING)
    assert healthcheck() == 0
    servicer.set("ladder.v1.Ladder", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert healthcheck() != 0
    readiness = main_container(one(overlay(FLAVOURS[flavour]), "Deployment"))["readinessProbe"]
    assert f"service='{readiness['grpc']['service']}'" in args[-1], "same service as the kubelet"
