"""Backends by name (``sandbox/registry.py``): the one door to a backend from outside
``sandbox/``, and a layer that keeps its rooms."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from context_fakes import NoBoxes

from sandbox import registry
from sandbox.errors import SandboxError, SandboxSpecError
from sandbox.spec import SandboxSpec

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def registered() -> Iterator[None]:
    saved = dict(registry._BACKENDS)
    try:
        yield
    finally:
        registry._BACKENDS.clear()
        registry._BACKENDS.update(saved)


def test_the_default_backend_is_docker_and_made_without_reaching_the_engine() -> None:
    from sandbox.docker.backend import DockerBackend

    backend = registry.get_backend(node="n1")
    assert type(backend) is DockerBackend and backend.node == "n1"
    assert backend._client is None  # connected on first use, not when made
    assert backend.adopts_prestarted


def test_an_unknown_backend_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(SandboxSpecError, match=r"no sandbox backend named 'k8s'; known: docker"):
        registry.get_backend("k8s")


def test_a_registered_backend_is_made_with_its_settings(registered: None) -> None:
    registry.register_backend("none")(NoBoxes)
    made = registry.get_backend("none", label="x")
    assert isinstance(made, NoBoxes) and made.label == "x"
    assert registry.backend_names() == ["docker", "none"]
    registry.register_backend("none")(NoBoxes)  # the same class again: a no-op
    with pytest.raises(SandboxSpecError, match="registered already"):
        registry.register_backend("docker")(NoBoxes)


def test_a_backend_that_starts_no_boxes_early_says_so() -> None:
    backend = NoBoxes()
    assert not backend.adopts_prestarted
    with pytest.raises(SandboxError, match="starts no boxes before a run"):
        backend.start_offline(SandboxSpec(), run="r", member="m", image="i")
    with pytest.raises(SandboxError, match="takes no boxes started before a run"):
        anyio.run(lambda: backend.adopt({}, SandboxSpec(), run="r", member="m"))


def _names_used(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            used |= {alias.name for alias in node.names}
        elif isinstance(node, ast.Name):
            used.add(node.id)
        elif isinstance(node, ast.Attribute):
            used.add(node.attr)
    return used


def test_nothing_above_the_sandbox_layer_names_a_backend_class() -> None:
    """The coordinator and the harness get backends from the registry: a backend's class
    is the sandbox layer's own business."""
    backends = {"DockerBackend"}
    offenders: dict[str, Any] = {}
    for package in ("coordinator", "subagents"):
        for path in (ROOT / package).rglob("*.py"):
            named = _names_used(path) & backends
            if named:
                offenders[str(path.relative_to(ROOT))] = sorted(named)
    assert offenders == {}


def test_the_sandbox_layer_keeps_at_most_twelve_modules_at_its_top() -> None:
    """The contract and what every backend shares; a backend, the images, the commands
    and the cluster each have a room of their own."""
    top = sorted(p.name for p in (ROOT / "sandbox").glob("*.py"))
    assert len(top) <= 12, top
    rooms = {p.name for p in (ROOT / "sandbox").iterdir() if (p / "__init__.py").exists()}
    assert rooms >= {"docker", "images", "cli", "cluster", "inbox"}
