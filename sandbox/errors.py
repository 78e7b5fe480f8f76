"""The sandbox error contract.

Every failure a caller can act on has its own type, and every message says what
was wrong and what to do next. All of them derive from :class:`SandboxError`, so
``except SandboxError`` catches everything the sandbox layer raises on purpose.

=====================  ==========================================================
error                  raised when
=====================  ==========================================================
SandboxSpecError       a spec is invalid (unknown field, negative limit, bad size
                       or host name); raised when the spec is built, one paragraph
                       naming every bad field and the fields there are
SandboxUnavailable     the engine cannot be reached, an image is unknown to the
                       engine, the box could not be created or started, or the
                       engine refused a call on a box that still runs (retry)
SnapshotGone           (a SandboxUnavailable) the setup's snapshot a box was to
                       start from is no longer on the engine (``ref``): removed by
                       gc or by hand after the run found it; set the setup up again
SandboxTimeout         a file or control operation (not ``exec``: a command that
                       runs past its timeout returns ``ExecResult.timed_out``)
                       did not finish in time
OutputLimitExceeded    a file read would return more than the allowed bytes
PathRefused            a path resolves outside the box's allowed roots
SandboxCrashed         the box died (OOM-killed, killed, exited), was removed, was
                       frozen (``docker pause``), or can no longer start a process
                       (``process-limit``); ``reason`` names why; every
                       later call on that box raises it again - a paused box stays
                       crashed after ``docker unpause`` (its commands stopped
                       mid-way, so its state cannot be trusted: use a new box).
                       Any Docker API error on a box that is not running comes out
                       as this, never as a ``docker`` exception
SandboxClosed          the box was closed by its owner and is used again
=====================  ==========================================================
"""

from __future__ import annotations


class SandboxError(Exception):
    """Base of every error the sandbox layer raises on purpose."""


class SandboxSpecError(SandboxError, ValueError):
    """The sandbox spec (or a request built from it) is invalid.

    ``problems`` holds ``(field, message)`` pairs and ``got`` the rejected values by
    field, for callers that render their own message (the job-file reader); both are
    empty when the error was raised with a message only.
    """

    def __init__(
        self,
        message: str,
        *,
        problems: list[tuple[str, str]] | None = None,
        got: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.problems: list[tuple[str, str]] = problems or []
        self.got: dict[str, str] = got or {}


class SandboxUnavailable(SandboxError):
    """The engine, an image, or the box itself cannot be had right now."""


class SnapshotGone(SandboxUnavailable):
    """The setup's snapshot ``ref`` a box was to start from is no longer on the engine."""

    def __init__(self, ref: str) -> None:
        super().__init__(
            f"the setup's snapshot {ref[:19]} is no longer on this engine (removed by "
            "'fleet sandbox prepared gc' or by hand after this run found it); the member's "
            "retry sets the setup up again"
        )
        self.ref = ref


class SandboxTimeout(SandboxError, TimeoutError):
    """A file or control operation on the box did not finish in time."""


class OutputLimitExceeded(SandboxError):
    """A read would return more bytes than allowed."""

    def __init__(self, message: str, *, limit: int, size: int | None = None) -> None:
        super().__init__(message)
        self.limit = limit
        self.size = size


class PathRefused(SandboxError, PermissionError):
    """A path resolves outside the box's allowed roots."""

    def __init__(self, path: str, roots: tuple[str, ...] | list[str]) -> None:
        roots_text = ", ".join(roots)
        super().__init__(
            f"path {path!r} is outside this sandbox's allowed roots ({roots_text}); "
            f"use a path under one of them"
        )
        self.path = path
        self.roots = tuple(roots)


class SandboxCrashed(SandboxError):
    """The box died; ``reason`` is one of ``oom-killed``, ``killed``, ``exited(N)``,
    ``removed``, ``paused`` (frozen; final even after an unpause) or ``process-limit``
    (it runs but cannot start a process), and ``detail`` carries what was seen."""

    def __init__(self, box: str, reason: str, detail: str = "") -> None:
        text = f"sandbox {box} crashed: {reason}"
        if detail:
            text += f" ({detail})"
        super().__init__(text)
        self.box = box
        self.reason = reason
        self.detail = detail


class SandboxClosed(SandboxError):
    """The box was closed by its owner and cannot be used any more."""
