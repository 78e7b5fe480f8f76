"""A pytest plugin: a test may not leave the worker's process state changed.

What one test leaves behind in its worker - a signal handler, an environment variable
(``DOCKER_HOST``, ``RAY_*``, ``ANTHROPIC_*``), the working directory, the umask - is met
by whichever test that worker runs next, so a suite with such a leak passes or fails by
the order its tests were dealt out in. Before each test's setup (before its fixtures,
of every scope) the state is read, and again after its teardown; a difference fails
that test, names what changed, and is undone so the next test starts clean. A session
fixture counts as part of the first test that asks for it: what it needs set for the
tests that use it, it sets for each of them (``monkeypatch``), not for the worker.

Loaded by ``conftest.py`` (``pytest_plugins``).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

VOLATILE = frozenset({"PYTEST_CURRENT_TEST"})
"""Environment variables pytest itself sets around each test."""

SIGNALS = tuple(
    sorted(signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}, key=int)  # type: ignore[arg-type]
)


@dataclass(frozen=True)
class ProcessState:
    handlers: dict[int, Any]
    environ: dict[str, str]
    cwd: str
    umask: str

    @classmethod
    def read(cls) -> ProcessState:
        environ = {k: v for k, v in os.environ.items() if k not in VOLATILE}
        return cls({int(s): signal.getsignal(s) for s in SIGNALS}, environ, os.getcwd(), _umask())

    def changes(self, after: ProcessState) -> list[str]:
        """What ``after`` differs in, a line each."""
        out = [
            f"the handler of {signal.Signals(s).name}: {self.handlers[s]!r} -> {h!r}"
            for s, h in after.handlers.items()
            if h is not self.handlers[s]
        ]
        for key in sorted(self.environ.keys() | after.environ.keys()):
            was, now = self.environ.get(key), after.environ.get(key)
            if was != now:
                shown = "unset" if now is None else "set" if was is None else "changed"
                out.append(f"environment variable {key} {shown}")  # values may be secrets
        if after.cwd != self.cwd:
            out.append(f"the working directory: {self.cwd} -> {after.cwd}")
        if after.umask != self.umask:
            out.append(f"the umask: {self.umask} -> {after.umask}")
        return out

    def restore(self) -> None:
        for s, handler in self.handlers.items():
            if handler is not None and signal.getsignal(s) is not handler:
                signal.signal(s, handler)
        for key in set(os.environ) - set(self.environ) - VOLATILE:
            del os.environ[key]
        os.environ.update(self.environ)
        os.chdir(self.cwd)
        os.umask(int(self.umask, 8))


def _umask() -> str:
    """Read without setting it (``os.umask`` sets it, for every thread, to read it)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Umask:"):
            return line.split()[1]
    return "?"


_BEFORE = pytest.StashKey[ProcessState]()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    item.stash[_BEFORE] = ProcessState.read()
    return (yield)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, None, None]:
    result = yield
    before = item.stash.get(_BEFORE, None)
    if before is None:
        return result
    changed = before.changes(ProcessState.read())
    if changed:
        before.restore()
        raise ProcessStateLeaked(
            "the test left this worker's process state changed (undone now):\n  "
            + "\n  ".join(changed)
        )
    return result


class ProcessStateLeaked(AssertionError):
    """A test left a signal handler, the environment, the cwd or the umask changed."""
