"""Imports run one way: no module of ours imports - at the top, lazily inside a
function, or under ``TYPE_CHECKING`` - a module that imports it back, and no room of
the coordinator imports a room above it.

A circle held apart by a lazy import works until someone moves the import; it also
says that a type sits in the wrong file. The check reads the source (every
``import`` statement anywhere in a module), so it sees what a run would not.

The coordinator's rooms (its sub-packages) are layered: :data:`ROOMS` says which rooms
each one builds on, and a room may import those and whatever they build on, never a
room above it. A module-level circle check alone would let two rooms import each other
through different modules; then neither can be read, tested or moved without the
other, and the next import closes a real circle.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("coordinator", "subagents", "sandbox")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Our modules that ``name`` imports, wherever the import statement stands."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    targets: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            targets += [f"{module}.{alias.name}" for alias in node.names]
    found = set()
    for target in targets:
        while target and target not in known:  # a name imported from a module
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)
    return found


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import path that leads from a module back to itself (one per circle)."""
    circles: list[list[str]] = []
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        for nxt in sorted(graph[name]):
            if nxt in path:
                circles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in done:
                visit(nxt, [*path, nxt])
        done.add(name)

    for name in sorted(graph):
        if name not in done:
            visit(name, [name])
    return circles


def test_no_module_imports_a_module_that_imports_it_back() -> None:
    known = _modules()
    graph = {name: _imports(name, path, known) for name, path in known.items()}
    assert graph["subagents.loop.loop"], "the import reader found nothing: it is broken"
    circles = [" -> ".join(c) for c in _circles(graph)]
    assert circles == [], "import circles:\n" + "\n".join(circles)


# The rooms each room builds on directly; a room may import these and all they build on.
# The top-level modules are rooms of their own: ``errors`` (any room may raise the
# expected errors) and ``api`` (the package, api.py and run_handle.py: the Python API,
# which drives a run through ``runner``). Lowest first.
ROOMS: dict[str, set[str]] = {
    "errors": set(),
    "journal": set(),
    "job": {"errors"},
    "rundir": {"job", "journal"},
    "oversight": {"errors", "journal"},
    "report": {"errors", "journal"},
    "nodes": {"rundir"},
    "attempts": {"nodes"},
    "fanout": {"attempts"},
    "lead": {"fanout", "oversight", "report"},
    "traceview": {"rundir", "oversight", "report"},
    "merge": {"nodes"},
    "runner": {"lead", "traceview", "merge"},
    "api": {"runner"},
    "cli": {"api"},
}
TOP_LEVEL = {
    "coordinator": "api",
    "coordinator.api": "api",
    "coordinator.run_handle": "api",
    "coordinator.errors": "errors",
}


def _room(module: str) -> str | None:
    """The room of one of the coordinator's modules (None: it has none yet)."""
    if module in TOP_LEVEL:
        return TOP_LEVEL[module]
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ROOMS else None


def _below(room: str) -> set[str]:
    """Every room ``room`` builds on, directly or through another."""
    seen: set[str] = set()
    todo = [room]
    while todo:
        for lower in ROOMS[todo.pop()] - seen:
            seen.add(lower)
            todo.append(lower)
    return seen


def test_the_rooms_are_layered_with_no_circle() -> None:
    assert set().union(*ROOMS.values()) <= set(ROOMS), "a room builds on an unknown room"
    circles = [" -> ".join(c) for c in _circles(ROOMS)]
    assert circles == [], "the rooms build on each other in a circle:\n" + "\n".join(circles)
    packages = {p.name for p in (ROOT / "coordinator").iterdir() if (p / "__init__.py").exists()}
    assert packages == set(ROOMS) - {"errors", "api"}, "a room without a place, or the reverse"


def test_no_room_imports_a_room_above_it() -> None:
    known = _modules()
    ours = {name: path for name, path in known.items() if name.split(".")[0] == "coordinator"}
    homeless = sorted(name for name in ours if _room(name) is None)
    assert homeless == [], f"modules in no room (give each a room): {homeless}"
    reaching_up, across = [], 0
    for name, path in ours.items():
        room = _room(name)
        assert room is not None
        allowed = _below(room) | {room}
        for target in sorted(_imports(name, path, known)):
            up = _room(target) if target.split(".")[0] == "coordinator" else room
            across += up != room
            if up not in allowed:
                reaching_up.append(f"{name} ({room}) imports {target} ({up})")
    assert across > 50, "the room reader found no import between rooms: it is broken"
    assert reaching_up == [], "a lower room imports a higher one:\n" + "\n".join(reaching_up)


def test_no_room_hides_a_name_of_the_python_api() -> None:
    """Importing a sub-package binds its name on ``coordinator``, and a bound name is
    found before the lazy exports' ``__getattr__``: a room named ``run`` would turn
    ``fleet.run`` into a module as soon as anything imported it."""
    import coordinator as fleet

    for room in set(ROOMS) - {"errors", "api"}:
        importlib.import_module(f"coordinator.{room}")
    hidden = sorted(set(fleet._EXPORTS) & set(vars(fleet)))
    assert hidden == [], f"names of the API hidden by a module of the same name: {hidden}"
    assert set(fleet.__all__) <= set(dir(fleet))


def test_the_tasks_run_on_every_node_import_nothing_that_runs_a_member() -> None:
    # A task on a Ray node imports its function's module by name in a fresh worker
    # process, once per node and command (every `fleet run --cluster`, every resume):
    # importing the agent loop and the model client there cost seconds of each node's
    # CPU before the run could start.
    import importlib.util
    import subprocess
    import sys

    ray = importlib.util.find_spec("ray")
    if ray is None:
        from conftest import missing_dependency

        missing_dependency("Ray is not installed (the 'cluster' extra)")
    where = subprocess.run(
        [sys.executable, "-c", "import coordinator.nodes.cluster as c\n"
         "print(c.check_node.__module__, c.reap_node.__module__)"],
        capture_output=True, text=True, check=True, cwd=ROOT,
    ).stdout.split()  # fmt: skip
    heavy = ("anthropic", "subagents.member", "coordinator.nodes.node")
    for module in set(where):
        code = f"import sys, {module}\nprint(sorted(m for m in {heavy!r} if m in sys.modules))"
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
        )
        assert done.stdout.strip() == "[]", (module, done.stdout)
