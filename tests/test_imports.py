"""Imports run one way: no module of ours imports - at the top, lazily inside a
function, or under ``TYPE_CHECKING`` - a module that imports it back.

A circle held apart by a lazy import works until someone moves the import; it also
says that a type sits in the wrong file. The check reads the source (every
``import`` statement anywhere in a module), so it sees what a run would not.
"""

from __future__ import annotations

import ast
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
    assert graph["subagents.loop"], "the import reader found nothing: it is broken"
    circles = [" -> ".join(c) for c in _circles(graph)]
    assert circles == [], "import circles:\n" + "\n".join(circles)
