"""Finding runs: one rule for every command that takes a run or lists them.

``fleet resume``, ``trace``, ``view`` and ``runs`` (and the Python API) all look in
the same place and accept the same names, so a run id that works for one works for
all of them:

* where: ``--output-dir DIR`` when given, else ``$FLEET_RUNS_DIR``, else ``./runs``
  (a new run goes to the job's own ``output_dir`` when the job file sets one);
* what: the path of a run directory, a run id under that place, or a unique prefix
  of one (``fleet resume research-2026`` when only one run starts so);
* a run directory is one with a journal (or, from an older Fleet, a ``members/``
  folder), so ``memory/`` beside the runs is never taken for one.

Kept free of heavy imports: ``fleet trace`` and ``fleet runs`` load it at start.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..journal.entries import parse_line

RUNS_DIR_ENV = "FLEET_RUNS_DIR"
SHOWN = 8
"""Known runs named in a not-found message (the most recent)."""


class RunNotFound(Exception):
    """No run directory matches what the user gave."""


def runs_root(output_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where runs are looked up: ``output_dir``, else ``$FLEET_RUNS_DIR``, else ``runs``."""
    if output_dir:
        return Path(output_dir)
    return Path(os.environ.get(RUNS_DIR_ENV) or "runs")


def is_run_dir(path: Path) -> bool:
    return (path / "journal.jsonl").is_file() or (path / "members").is_dir()


def run_dirs(root: Path) -> list[Path]:
    """Every run directory directly under ``root``, oldest first."""
    if not root.is_dir():
        return []
    return sorted((d for d in root.iterdir() if is_run_dir(d)), key=created_at)


def created_at(path: Path) -> float:
    """When the run in ``path`` was created (its journal's first entry); 0 when unknown."""
    try:
        with (path / "journal.jsonl").open(encoding="utf-8", errors="replace") as fh:
            first = parse_line(fh.readline())
    except OSError:
        return 0.0
    return first.ts if first is not None else 0.0


def find_run(ref: str, output_dir: str | os.PathLike[str] | None = None) -> Path:
    """The run directory ``ref`` names (see the module docstring), or RunNotFound."""
    given = Path(ref)
    if is_run_dir(given):
        return given
    root = runs_root(output_dir)
    if "/" not in ref and ref not in ("", ".", ".."):
        if is_run_dir(root / ref):
            return root / ref
        matches = [d for d in run_dirs(root) if d.name.startswith(ref)]
        if len(matches) == 1:
            return matches[0]
        if matches:
            names = ", ".join(d.name for d in matches[-SHOWN:])
            raise RunNotFound(
                f"several runs under {root}/ start with {ref!r} ({names}); give more of the id"
            )
    if "/" in ref:
        raise RunNotFound(
            f"no run directory at {ref} (a run directory holds journal.jsonl); give the "
            "path of a run directory, or a run id from 'fleet runs'"
        )
    known = [d.name for d in run_dirs(root)]
    where = f"no run directory {ref!r} under {root}/"
    hint = f" (its runs: {', '.join(known[-SHOWN:])})" if known else " (it holds no runs)"
    raise RunNotFound(
        f"{where}{hint}; give a run id from 'fleet runs' (or the start of one) or a run "
        f"directory; runs elsewhere: --output-dir DIR or {RUNS_DIR_ENV}=DIR"
    )
