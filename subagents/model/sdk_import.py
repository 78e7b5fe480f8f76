"""The ``anthropic`` SDK imported on a thread while a run starts, not in series before
its first model call.

Importing the SDK is most of what a Claude run's first request waits for (about 1.1 s
on a 2-core machine, two thirds of it ``anthropic.types``). Before this module, the
preflight made every model the job names, so the import ran in series before Fleet's
job check, the preflight and the box start. Now a command starts :func:`start` as
soon as it knows a Claude model is used (``fleet run`` from the job file's text,
before the rest of Fleet loads; ``fleet code`` / ``fleet research`` from ``--model``
once parsed; the Python API from the job it was given: :mod:`coordinator.cli.early`,
:mod:`coordinator.api`). The preflight checks a Claude model's credentials without the
SDK (:mod:`.credentials`) and joins the import only as its last step
(:func:`coordinator.runner.preflight.check_sdk`, which says why there); the first
:func:`~.factory.make_model` of a real model then finds :mod:`.claude` loaded. Offline
and replay models never call :func:`start` (the callers test
:func:`~.names.calls_the_api` first): such a run never loads the SDK.

What could go wrong, and why it does not:

- **Two threads importing at once.** Python gives each module its own import lock: a
  thread importing a module another thread is still executing waits for it and then
  sees the finished module, never a half-initialised one. The exception is a
  circular import entered from both ends at once (Python then hands one side the
  partial module rather than deadlock). The thread imports third-party modules only
  (:data:`SDK_MODULES`), never Fleet's: it holds no lock a Fleet module is waiting
  for, and the packages it imports do not import Fleet, so no circle can span the
  two threads. The main thread's ``import subagents.model.claude`` simply waits on
  ``anthropic``'s lock (``tests/test_sdk_import.py`` imports it mid-way through the
  thread's import).
- **The import fails** (a broken or missing install). The thread swallows the error
  and prints nothing; the module is not left in ``sys.modules``, so the preflight's
  own import (:func:`~coordinator.runner.preflight.check_sdk`) runs it again in the
  main thread and fails there with the same error, which the user reads once, as one
  paragraph, before any run exists (exit 1).
- **A run that ends before any model call** (bad input, a preflight refusal,
  Ctrl-C). The thread is a daemon: the interpreter does not wait for it at exit, and
  it writes nothing.
- **Only once per process**: a second :func:`start` (another API call in the same
  program, ``check_new`` after the command line started it) is a no-op.

The GIL runs the import and the main thread's Python work one at a time; what the
thread fills is the time the main thread waits on the Docker engine, the disk and
the prewarm's boxes. ``bench/first_call.py`` measures the first request against a
bare ``import anthropic``.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Iterable

from .names import calls_the_api

SDK_MODULES = ("anthropic", "httpcore2", "truststore")
"""What the first model call imports of third-party code, in order: the SDK, then
what its client's transport and TLS context load when the client is built."""

_lock = threading.Lock()
_thread: threading.Thread | None = None


def start() -> bool:
    """Start importing :data:`SDK_MODULES` on a daemon thread, once per process; True
    when this call started it (False: already started, or already imported)."""
    global _thread
    with _lock:
        if _thread is not None or "anthropic" in sys.modules:
            return False
        _thread = threading.Thread(target=_work, name="fleet-sdk-import", daemon=True)
        _thread.start()
        return True


def start_for(names: Iterable[str]) -> bool:
    """:func:`start` when one of the model strings ``names`` calls the Messages API."""
    return start() if any(isinstance(n, str) and calls_the_api(n) for n in names) else False


def _work() -> None:
    for name in SDK_MODULES:
        try:
            importlib.import_module(name)
        except BaseException:  # the main thread's own import reports it, once
            return
