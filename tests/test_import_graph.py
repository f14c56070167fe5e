"""The product's import graph, read from the source (every import, those under TYPE_CHECKING too):
the modules of engine/ and service/ import each other without a circle, service/'s rooms import
only the rooms below them, the gRPC servicer stays in the gRPC layer, and the `Engine` class stays
with what builds it."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "service")
GRPC_LAYER = {"service.grpc.door"}  # registers the servicer on a grpc.aio server


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, str]]:
    """(module imported, name imported from it or "") for every import of a product module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from ((alias.name, "") for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    yield f"{base}.{alias.name}", ""
                elif base in known:
                    yield base, alias.name


def graph() -> tuple[dict[str, set[str]], dict[str, set[tuple[str, str]]]]:
    known = modules()
    edges: dict[str, set[str]] = {name: set() for name in known}
    names: dict[str, set[tuple[str, str]]] = {name: set() for name in known}
    for name, path in known.items():
        for module, imported in imports(name, path, known):
            edges[name].add(module)
            names[name].add((module, imported))
    return edges, names


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_reader_sees_every_room_and_finds_a_planted_circle() -> None:
    edges, _ = graph()
    assert {"engine.executor.engine", "service.grpc.servicer", "service.http.app"} <= set(edges)
    assert "engine.executor.step" in edges["engine.executor.engine"]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_in_engine_or_service() -> None:
    edges, _ = graph()
    assert circles(edges) == []


def test_only_the_grpc_layer_imports_the_servicer() -> None:
    _, names = graph()
    importers = {name for name, found in names.items() if any(m == "service.grpc.servicer" for m, _ in found)}
    assert importers <= GRPC_LAYER, importers - GRPC_LAYER


def test_no_module_but_its_own_imports_the_engine_class() -> None:
    """The product drives an engine through engine.executor.step.Driven (the worker, the served
    model) and narrow protocols (the probe, the warm-up, a step's run, parking); service/loading.py
    builds one with `load_engine`."""
    _, names = graph()
    importers = {
        name
        for name, found in names.items()
        if ("engine.executor.engine", "Engine") in found or ("engine.executor", "Engine") in found
    }
    assert importers == set(), importers


def test_the_engine_inherits_from_no_part() -> None:
    """`Engine` is a composition of parts that own their state (the session table, the prefill
    runner, the batch decoder): it holds them, so no part's state is the engine's by inheritance
    and no part can reach the engine's."""
    from engine.executor.engine import Engine

    assert Engine.__bases__ == (object,)


# service/'s rooms, each importing only the rooms listed for it (and the top-level modules, the
# shared vocabulary: config, errors, calls, events, metrics, the served model, ...): the engine
# worker at the bottom, then the core, the call side, the protocols, the frontend processes; the door
# every call passes (its record, the call log, the callers) is below both protocols, neither of which
# imports the other's. The worker's job bodies work on a session's state, the one thing of the
# core's they touch.
ROOMS_BELOW = {
    "service.worker": {"service.core.sessions"},
    "service.core": {"service.worker"},
    "service.door": set(),
    "service.front": {"service.core", "service.door"},
    "service.interceptors": {"service.door"},
    "service.grpc": {"service.front", "service.core", "service.door", "service.interceptors"},
    "service.http": {"service.front", "service.door"},
    "service.processes": {
        "service.front",
        "service.core",
        "service.door",
        "service.grpc",
        "service.http",
        "service.interceptors",
    },
}
# Top-level modules that may reach into rooms: the server and its entry assemble them; the settings
# table lists the tool-call formats a flag may name.
ASSEMBLERS = {"service.server": set(ROOMS_BELOW), "service.entry": set(ROOMS_BELOW)}
TOP_EXCEPTIONS = {"service.settings": {"service.front.tool_formats"}}


def _room(module: str) -> str | None:
    return next((room for room in ROOMS_BELOW if module == room or module.startswith(room + ".")), None)


def _allowed(importer: str, imported: str) -> bool:
    room, theirs = _room(importer), _room(imported)
    if theirs is None or theirs == room:
        return True  # the top level (or the engine), or within the room
    if room is None:
        return importer in ASSEMBLERS or imported in TOP_EXCEPTIONS.get(importer, set())
    return any(imported == below or imported.startswith(below + ".") for below in ROOMS_BELOW[room])


def test_each_room_of_service_imports_only_the_rooms_below_it() -> None:
    edges, _ = graph()
    assert set(ROOMS_BELOW) <= set(edges), "every room is a package the reader sees"
    wrong = sorted(f"{a} -> {b}" for a, found in edges.items() for b in found if not _allowed(a, b))
    assert wrong == []


def test_the_room_rule_finds_a_planted_import_upward() -> None:
    assert not _allowed("service.worker.scheduler", "service.front.texts")
    assert not _allowed("service.calls", "service.core.sessions")
    assert _allowed("service.worker.generation", "service.core.sessions")
    assert _allowed("service.server", "service.processes.frontends")
    assert not _allowed("service.http.app", "service.interceptors.auth")
    assert not _allowed("service.door.call_log", "service.interceptors.access_log")
