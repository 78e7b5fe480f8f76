"""A command run at a pseudo-terminal, as a person would run it: what it wrote to
the screen, and keys typed into it."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass
class Terminal:
    master: int
    proc: subprocess.Popen[bytes]
    deadline: float
    screen: bytes = b""

    def read(self) -> None:
        ready, _, _ = select.select([self.master], [], [], 0.2)
        if ready:
            try:
                self.screen += os.read(self.master, 65536)
            except OSError:
                pass

    def until(self, text: bytes) -> None:
        """Read until ``text`` is on the screen (or the deadline passes)."""
        while text not in self.screen and time.monotonic() < self.deadline:
            self.read()

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def finish(self) -> int:
        """Read until the command exits (killed at the deadline); its exit code."""
        while self.proc.poll() is None and time.monotonic() < self.deadline:
            self.read()
        self.proc.kill()
        return self.proc.wait()


@contextmanager
def at_a_terminal(argv: list[str], timeout: float) -> Iterator[Terminal]:
    """Run ``argv`` with a pseudo-terminal as its stdin, stdout and stderr."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    try:
        yield Terminal(master, proc, time.monotonic() + timeout)
    finally:
        proc.kill()
        proc.wait()
        os.close(master)
