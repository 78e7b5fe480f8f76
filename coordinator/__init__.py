"""Fleet's coordinator, and Fleet's Python API (see :mod:`coordinator.api`).

    import coordinator as fleet
    result = fleet.run("examples/research.toml")

The API's names are loaded on first use, so ``fleet sandbox ls`` (which imports
this package) does not pay for importing the model client and the fan-out.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import RunFailed, RunNotStarted, load, resume, run, run_async
    from .driver import RunOptions, RunSummary
    from .jobfile import JobError
    from .spec import Job, MemberJob

_EXPORTS = {
    "load": "api",
    "run": "api",
    "run_async": "api",
    "resume": "api",
    "RunFailed": "api",
    "RunNotStarted": "api",
    "RunOptions": "driver",
    "RunSummary": "driver",
    "JobError": "jobfile",
    "Job": "spec",
    "MemberJob": "spec",
}
__all__ = [
    "Job",
    "JobError",
    "MemberJob",
    "RunFailed",
    "RunNotStarted",
    "RunOptions",
    "RunSummary",
    "load",
    "resume",
    "run",
    "run_async",
]


def __getattr__(name: str) -> Any:
    home = _EXPORTS.get(name)
    if home is None:
        raise AttributeError(f"module 'coordinator' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
