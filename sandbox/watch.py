"""The workspace's stamps print as a box last reported it, and when that still holds.

A box asked to watch its workspace (:meth:`sandbox.base.Sandbox.watch_workspace`)
asks its agent for the stamps print (:mod:`sandbox.inbox.stamps`) with every command,
taken in the box once the command and everything it left running have ended. A coding
member's checkpoint compares it with the print of its newest checkpoint: equal, and
the turn needs no call of its own.

A print stands for the workspace only while nothing else could have written since it
was taken, so it is kept only when its command ran alone - no other operation that may
write (a command, a file write, an upload) was running when it started, started while
it ran, or ended before its reply came - and it is dropped as soon as another such
operation starts. A box with a long-lived process of its own (an MCP server, which
writes whenever it is called, through no operation seen here) never has one. Reads
and listings leave it alone: they write nothing. What the host keeps is a 64-digit hex
string or nothing: whatever else the box puts there is no print.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .inbox.stamps import is_print


class WorkspaceWatch:
    """One box's operations that may write, counted, and the print of the last command."""

    def __init__(self) -> None:
        self.on = False
        """Ask for the print with every command (set by :meth:`Sandbox.watch_workspace`)."""
        self._started = 0
        self._running = 0
        self._live = False
        self._print: str | None = None

    @property
    def settled(self) -> str | None:
        """The print of the last command, if it ran alone and nothing may have written since."""
        return None if self._live else self._print

    def live_process(self) -> None:
        """A long-lived process now runs in the box: no print holds from now on."""
        self._live = True
        self._print = None

    @contextmanager
    def writer(self) -> Iterator[None]:
        """An operation that may write to the workspace (it drops the print)."""
        self._begin()
        try:
            yield
        finally:
            self._running -= 1

    @contextmanager
    def command(self) -> Iterator[Callable[[object], None]]:
        """A command: what it yields takes the print its reply carried."""
        alone = self._begin() == 1
        mine = self._started

        def report(value: object) -> None:
            if alone and self._running == 1 and self._started == mine and is_print(value):
                self._print = value if isinstance(value, str) else None

        try:
            yield report
        finally:
            self._running -= 1

    def _begin(self) -> int:
        self._started += 1
        self._running += 1
        self._print = None
        return self._running
