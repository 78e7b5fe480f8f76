"""Backends by name: the one door to a :class:`~sandbox.base.SandboxBackend` from outside
``sandbox/``.

A caller - the coordinator's run, a cluster node, the command line - says which backend
it wants and with which settings, and never imports a backend's module or constructs
one itself. So a new backend is a room of its own under ``sandbox/`` plus one
registration, and nothing above ``sandbox/`` changes: the way Inspect AI's
``@sandboxenv`` decorator and mini-swe-agent's ``get_environment`` keep their callers
ignorant of providers. Fleet's own backends are named by where their class lives and
imported on first use, so naming a backend costs nothing until one is made (the Docker
backend brings the Docker SDK with it); another package registers its class with
:func:`register_backend`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, TypeVar

from .base import SandboxBackend
from .errors import SandboxSpecError

DEFAULT = "docker"
"""The backend a caller gets when it names none: the local Docker engine."""

_BACKENDS: dict[str, str | type[SandboxBackend]] = {
    "docker": "sandbox.docker.backend:DockerBackend",
}

B = TypeVar("B", bound=type[SandboxBackend])


def register_backend(name: str) -> Callable[[B], B]:
    """Class decorator: make ``name`` give this backend (a name already taken is refused)."""

    def register(cls: B) -> B:
        known = _BACKENDS.get(name)
        if known is not None and known is not cls:
            raise SandboxSpecError(f"a sandbox backend named {name!r} is registered already")
        _BACKENDS[name] = cls
        return cls

    return register


def backend_names() -> list[str]:
    """Every registered backend's name."""
    return sorted(_BACKENDS)


def backend_class(name: str = DEFAULT) -> type[SandboxBackend]:
    """The class registered as ``name``; :class:`SandboxSpecError` names the known ones."""
    found = _BACKENDS.get(name)
    if found is None:
        raise SandboxSpecError(
            f"no sandbox backend named {name!r}; known: {', '.join(backend_names())}"
        )
    if isinstance(found, str):
        module, _, attr = found.partition(":")
        cls: type[SandboxBackend] = getattr(importlib.import_module(module), attr)
        _BACKENDS[name] = found = cls
    return found


def get_backend(name: str = DEFAULT, /, **settings: Any) -> SandboxBackend:
    """A new backend ``name`` made with ``settings`` (its constructor's keywords; for
    ``docker``: ``client``, ``images``, ``node``)."""
    return backend_class(name)(**settings)
