"""A long-lived process in a box whose stdin and stdout are a byte stream on the host.

:meth:`Sandbox.exec` runs a command to its end; some programs instead live as long as
their user and talk over stdio the whole time - an MCP server is one
(:meth:`Sandbox.start_process`). A backend gives such a process its own stream (the
Docker backend: its own ``docker exec -i``, :mod:`sandbox.docker.process`).

Error contract: :meth:`BoxProcess.send` and :meth:`BoxProcess.receive` raise
:class:`ProcessEnded` (with the stderr tail) once the process or its box is gone;
:meth:`BoxProcess.close` never raises. The process runs as the box's user, with the
box's limits and network, and dies with the box.
"""

from __future__ import annotations

import abc


class ProcessEnded(Exception):
    """The process's stream ended (it exited, or its box died); ``stderr``: its last words."""

    def __init__(self, message: str, stderr: str = "") -> None:
        tail = stderr.strip()[-1500:]
        super().__init__(message + (f"; its stderr ended with:\n{tail}" if tail else ""))
        self.stderr = stderr


class BoxProcess(abc.ABC):
    """stdin and stdout of one long-lived process in a box."""

    name: str
    """What the process is, for messages (its command and its box)."""
    ended: ProcessEnded | None = None
    """Set once its stream has ended; every later call raises it."""

    @property
    @abc.abstractmethod
    def stderr_tail(self) -> str:
        """The end of what it wrote to stderr so far."""

    @abc.abstractmethod
    async def send(self, data: bytes) -> None:
        """Write to the process's stdin.

        Raises:
            ProcessEnded: the process or its box is gone.
        """

    @abc.abstractmethod
    async def receive(self) -> bytes:
        """The next stdout bytes (never empty).

        Raises:
            ProcessEnded: at its end, once everything it wrote was received.
        """

    @abc.abstractmethod
    async def close(self) -> None:
        """Close stdin and the stream: the process sees end of input (and is killed with
        its box in any case). Never raises."""
