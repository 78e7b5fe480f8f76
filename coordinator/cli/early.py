"""What ``fleet`` starts before the rest of Fleet loads: the first wave's boxes of
``fleet run JOB`` (:mod:`coordinator.nodes.prewarm`), the ``anthropic`` SDK's import
(:mod:`subagents.model.sdk_import`) when the command will call the Messages API, and
the token probe of the Ray cluster it will use (:mod:`sandbox.cluster.auth`).

Each is read from what is known that early, with the standard library only: the job
file's raw TOML for ``fleet run`` (the job is validated afterwards, as always; a file
that does not read as a job starts nothing), the parsed ``--model`` for ``fleet code``
and ``fleet research`` (argparse's own reading, so an abbreviated ``--mod offline``
counts as what it is), the parsed ``--cluster`` (or ``FLEET_CLUSTER`` for a run). The model fields read are those the preflight makes
(:func:`coordinator.runner.preflight.model_names`): ``[model] name`` (default
``auto``), each member's ``model``, ``[synthesis] model`` and ``[lead] model``. A
wrong guess costs nothing but time: a model the job does not use is never made, and
an offline run whose file reads as Claude here would have imported the SDK in its
preflight anyway (it checks the model named there).

The garbage collector is paused while a command loads (:func:`pause_gc`), and the
objects loaded by then are frozen out of later collections (:func:`resume_gc`). A
start imports about 270,000 objects (the SDK's 600-odd pydantic types, Fleet's
models) and creates almost no garbage (about 3,600 unreachable objects once loaded),
yet the collector ran about 430 times on the way, three of them full passes over
everything: 0.5-0.8 s of CPU on this 2-core machine, more than Fleet's own imports.
What is frozen is what a process keeps to its end anyway (modules, classes); the few
thousand objects that were already garbage stay, a bounded one-time cost. The run
itself, and every command that does not run one, collects as usual. A preflight that
builds a missing image (a first run, changed ``images/``: a minute or more) builds it
with the collector paused too: what it allocates is freed by reference counting as
always, only reference cycles wait for the resume. Only the command
line does this: it owns its process; the Python API never changes its caller's
collector.
"""

from __future__ import annotations

import argparse
import gc
import os
import tomllib
from pathlib import Path
from typing import Any

from subagents.model import sdk_import

MAX_JOB_BYTES = 64 << 20
"""A job file larger than this is not read early (its validation says what it is)."""


def job_file(argv: list[str]) -> Path | None:
    """The job file of ``fleet run JOB`` (None for any other command, or ``--help``)."""
    if not argv or argv[0] != "run" or "-h" in argv or "--help" in argv:
        return None
    files = [a for a in argv[1:] if not a.startswith("-") and os.path.isfile(a)]
    return Path(files[0]) if files else None


def prewarm(argv: list[str]) -> Any:
    """Start the first wave's boxes of ``fleet run JOB`` (not on a cluster)."""
    path = job_file(argv)
    if path is None or "--cluster" in argv or os.environ.get("FLEET_CLUSTER"):
        return None
    from ..nodes.prewarm import Prewarm

    return Prewarm.start(path)


def job_models(raw: Any) -> list[str]:
    """The model strings a job's raw TOML names, where the preflight reads them."""
    if not isinstance(raw, dict):
        return []

    def table(name: str) -> dict[str, Any]:
        value = raw.get(name)
        return value if isinstance(value, dict) else {}

    names: list[Any] = [table("model").get("name", "auto")]
    members = raw.get("members")
    if isinstance(members, list):
        names += [m.get("model") for m in members if isinstance(m, dict)]
    names += [table("synthesis").get("model"), table("lead").get("model")]
    return [n for n in names if isinstance(n, str)]


def sdk_for_job(argv: list[str]) -> bool:
    """Start the SDK's import for ``fleet run JOB`` when the job calls the Messages API."""
    path = job_file(argv)
    if path is None:
        return False
    try:
        if path.stat().st_size > MAX_JOB_BYTES:
            return False
        with path.open("rb") as f:
            raw = tomllib.load(f)
    except Exception:  # unreadable, not TOML, nested past the parser's recursion limit
        return False  # its validation says why, in the main thread
    return sdk_import.start_for(job_models(raw))


def sdk_for_command(args: argparse.Namespace) -> bool:
    """Start the SDK's import for ``fleet code`` / ``fleet research`` when ``--model``
    (default ``auto``) calls the Messages API."""
    if getattr(args, "command", None) not in ("code", "research"):
        return False
    model = getattr(args, "model", None)
    return sdk_import.start_for([model if isinstance(model, str) else "auto"])


CLUSTER_FROM_ENV = ("run", "resume", "code", "research")
"""The commands whose members run on ``FLEET_CLUSTER`` when no ``--cluster`` is given."""


def cluster_probe(args: argparse.Namespace) -> bool:
    """Start the token probe of the Ray cluster a command will connect to
    (:func:`sandbox.cluster.auth.probe_soon`): ``--cluster``, or ``FLEET_CLUSTER`` for
    a run. Every command that takes ``--cluster`` connects through that probe."""
    address = getattr(args, "cluster", None)
    if not address and getattr(args, "command", None) in CLUSTER_FROM_ENV:
        address = os.environ.get("FLEET_CLUSTER")
    if not isinstance(address, str) or not address:
        return False
    from sandbox.cluster.auth import probe_soon

    probe_soon(address)
    return True


_gc = {"paused": False, "frozen": False}


def pause_gc() -> None:
    """Pause the garbage collector while the command loads (see the module's docstring);
    a collector someone else disabled is left as it is."""
    if gc.isenabled():
        gc.disable()
        _gc["paused"] = True


def resume_gc() -> None:
    """The command has loaded: what is loaded is frozen out of later collections (the
    first time in a process: a program calling :func:`coordinator.cli.main` again and
    again - the tests - must not freeze each run's leftovers) and the collector runs as
    usual from now on. Idempotent; a no-op unless :func:`pause_gc` paused it."""
    if not _gc["paused"]:
        return
    if not _gc["frozen"]:
        gc.freeze()
        _gc["frozen"] = True
    _gc["paused"] = False
    gc.enable()
