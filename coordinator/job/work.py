"""What a member works on beside its spec: :class:`MemberWork`, one shape from the job
file to the worker.

The harness's :class:`~subagents.spec.MemberSpec` is what the member is asked (its
task, model, limits, box, the job's result schema). What the coordinator's side of
an attempt does before the harness starts - copy the repository into the box, write
the job's files, start from the setup's snapshot, run several attempts at once - is
this model's, and nothing else's.

Decision - one declaration, inherited on both sides: a job file's member
(:class:`~coordinator.job.spec.MemberJob`) and the unit a worker runs
(:class:`~coordinator.nodes.worker.MemberUnit`) both are a ``MemberWork``, and the
driver hands one to the other in one call (:meth:`MemberWork.work`). A new setting of
this kind is declared here once and reaches the worker with no line written between
them; the job file keeps its keys flat per member (inheritance adds no table), so
``members.json`` of a run made before this model still reads the same. The fields'
own checks (file names, the setup's short form) are here for the same reason; what
depends on the member's kind (these are coding members' settings) stays with
:class:`~coordinator.job.spec.MemberJob`, which knows the kind.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from sandbox.prepared.spec import SetupSpec
from sandbox.strict import Strict

MAX_ATTEMPTS = 8
"""Most attempts of one coding member (``attempts``)."""
MAX_FILES_BYTES = 64 * 1024
"""A member's ``files`` in all (names and contents): examples and small scripts."""


class MemberWork(Strict):
    """A member's workspace and how many attempts at it run at once."""

    repo: str | None = None
    """Coding members: host directory copied into the box (the original is untouched)."""
    files: dict[str, str] = Field(default_factory=dict)
    """Coding members: small text files written into ``/workspace`` before the member
    starts (relative name -> content), e.g. an example to run; 64 KB in all at most."""
    setup: SetupSpec | None = None
    """Coding members: the repository's setup (``setup = "pip install -e ."``, ``"auto"``
    or a table: ``run``, ``allow``, ``wheels``, ``secrets``, ``timeout_s``,
    ``key_files``, ``refresh``), run once per key in a box of the member's image, its
    result cached on the engine; the member starts from it with no network
    (:mod:`sandbox.prepared`)."""
    attempts: int = Field(default=1, ge=1, le=MAX_ATTEMPTS)
    """Coding members: independent attempts at the task, run at once, each in its own
    box from the same tree; the member's patch is the one chosen among them
    (:mod:`coordinator.attempts`). Each attempt has the member's limits."""

    @field_validator("setup", mode="before")
    @classmethod
    def _setup_shape(cls, v: Any) -> Any:
        if isinstance(v, str):
            return {"run": v}
        return v

    @field_validator("files")
    @classmethod
    def _file_names(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            parts = name.split("/")
            if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
                raise ValueError(
                    f"{name!r} is not a relative file name inside /workspace (e.g. 'check.py')"
                )
        size = sum(len(k.encode()) + len(c.encode()) for k, c in v.items())
        if size > MAX_FILES_BYTES:
            raise ValueError(f"the files hold {size} bytes; at most {MAX_FILES_BYTES} in all")
        return v

    def work(self) -> dict[str, Any]:
        """These settings by name, as they are (no copy of a file's text): what a model
        that is a ``MemberWork`` too is built with, e.g. ``MemberUnit(..., **m.work())``."""
        return {name: getattr(self, name) for name in MemberWork.model_fields}
