"""Context mechanisms of one member: budget, offload, clip, compaction, todos, memory.

:class:`ContextManager` is loaded on first use (PEP 562): a job file's settings
(:mod:`.config`) are read by commands that never run a member and need not load the
model client the manager's module imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .config import ContextConfig

if TYPE_CHECKING:
    from .manager import ContextManager

__all__ = ["ContextConfig", "ContextManager"]


def __getattr__(name: str) -> Any:
    if name == "ContextManager":
        from .manager import ContextManager

        globals()[name] = ContextManager
        return ContextManager
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
