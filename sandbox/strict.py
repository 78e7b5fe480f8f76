"""The one base of Fleet's boundary models (job spec, sandbox spec, member result,
report): unknown keys are refused, and constructing one directly can raise its
family's own error instead of pydantic's multi-line ``ValidationError``.

Why the ``__init__`` is marked as pydantic's own (``__pydantic_base_init__``):
pydantic calls an overridden ``__init__`` for every nested model it validates too,
so a family's error raised there would replace the whole tree's error - and its
paths (``members[0].limits.max_turns``) - with the inner model's. Marked, it runs only
for ``Model(...)`` written in code; ``model_validate`` of a whole tree keeps
pydantic's errors and their paths.

It lives in ``sandbox`` because that is the package every other one imports and
which imports none of them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError


class Strict(BaseModel):
    """``extra="forbid"``: a typo in a key is an error, not a silently ignored field.
    ``Model(...)`` written in code raises what :meth:`_invalid` makes of pydantic's
    error (the job file's :class:`~coordinator.job.jobfile.JobError`, the sandbox's
    :class:`~sandbox.errors.SandboxSpecError`); by default pydantic's own."""

    model_config = ConfigDict(extra="forbid")

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise self._invalid(exc) from None

    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @classmethod
    def _invalid(cls, exc: ValidationError) -> Exception:
        """The error a direct construction raises; by default pydantic's own."""
        return exc
