"""Processes a test starts and then signals, started so that the signal can arrive.

A non-interactive shell starts a background job (``make test &``, ``nohup``, many CI
runners) with SIGINT and SIGQUIT ignored, Python keeps an ignored signal ignored, and
every process started below inherits it: a test that sends SIGINT to a child it started
plainly waits for nothing there. :func:`popen` starts the child with SIGINT, SIGTERM and
SIGQUIT at their defaults, whatever this process inherited, through coreutils'
``env --default-signal`` (an ``exec``: the child keeps the pid the test sees, and no
Python runs between ``fork`` and ``exec``, which ``preexec_fn`` would need and which is
unsafe in a process with threads). Its :meth:`Child.send_signal` refuses, at once and
by name, a signal the child ignores all the same, instead of the test waiting for an
end that cannot come.

:func:`ignoring` makes this process ignore signals for a while, as a background job's
shell does (tests run in the worker's main thread: pytest-xdist's ``main_thread_only``).
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

DEFAULTS = (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT)
"""The signals a started child has at their default action."""


def with_default_signals(argv: Sequence[str]) -> list[str]:
    """``argv`` run with :data:`DEFAULTS` at their default action."""
    names = ",".join(signal.Signals(s).name.removeprefix("SIG") for s in DEFAULTS)
    return ["env", f"--default-signal={names}", "--", *map(str, argv)]


class Child(subprocess.Popen[Any]):
    """A started child whose :meth:`send_signal` checks, the first time it sends a
    signal, that it can arrive. Only the first: a child may ignore a signal later by
    its own choice (the command line ignores a second Ctrl-C while it exits)."""

    _sent: set[int]

    def send_signal(self, sig: int) -> None:
        sent = self.__dict__.setdefault("_sent", set())
        if sig not in sent and self.poll() is None and sig in ignored(self.pid):
            raise AssertionError(
                f"process {self.pid} ignores {signal.Signals(sig).name}; start it "
                "with process_support.popen, which resets what a background job inherits"
            )
        sent.add(sig)
        super().send_signal(sig)


def popen(argv: Sequence[str], **kwargs: Any) -> Child:
    """``subprocess.Popen(argv, **kwargs)`` with :data:`DEFAULTS` at their defaults."""
    return Child(with_default_signals(argv), **kwargs)


def ignored(pid: int | str = "self") -> set[int]:
    """The signals process ``pid`` ignores (``SigIgn`` in ``/proc/PID/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            mask = int(line.split()[1], 16)
            return {n for n in range(1, 65) if mask & (1 << (n - 1))}
    return set()


@contextmanager
def ignoring(*signums: int) -> Iterator[None]:
    """This process ignores ``signums`` inside the block; its handlers are put back."""
    before = {s: signal.getsignal(s) for s in signums}
    try:
        for s in signums:
            signal.signal(s, signal.SIG_IGN)
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


@contextmanager
def served_api(argv: Sequence[str]) -> Iterator[str]:
    """A fake Messages API in a process of its own (``argv``: a benchmark's ``--serve``
    mode, which prints its URL and serves until its stdin closes), with this process's
    ``ANTHROPIC_BASE_URL`` and key pointed at it meanwhile; yields the URL."""
    import os

    server = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        os.environ["ANTHROPIC_BASE_URL"] = url
        os.environ["ANTHROPIC_API_KEY"] = "bench-key"
        yield url
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(timeout=30)
