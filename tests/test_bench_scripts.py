"""Every benchmark in ``bench/`` still starts: the figures in ``bench/README.md`` must be
reproducible with the command beside them, and a script that no longer imports (a
helper it took from another script was renamed, its directory's ``sandbox.py``
shadowing the package) would say otherwise only when someone reruns it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
SCRIPTS = sorted(BENCH.glob("*.py"))


def test_there_are_benchmarks() -> None:
    assert len(SCRIPTS) >= 10


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_benchmark_imports_and_answers_help(script: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.lower().startswith("usage:"), proc.stdout[:500]
