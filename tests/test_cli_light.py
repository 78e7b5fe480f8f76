"""Commands that only read runs - and a job file with a mistake in it - answer without
loading the model client: ``anthropic`` takes about a second to import, which every
``fleet trace`` or ``fleet runs`` would otherwise pay."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

_PROBE = """
import json, sys
from coordinator.cli import main
code = main(sys.argv[1:])
print(json.dumps([code, sorted(m for m in ("anthropic", "coordinator.runner.driver") if m in sys.modules)]))
"""


def _fleet_modules(*args: str) -> tuple[int, list[str]]:
    """The exit code of ``fleet ARGS`` in a fresh interpreter, and which heavy modules
    it loaded."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, timeout=60
    )
    code, loaded = json.loads(done.stdout.strip().splitlines()[-1])
    return code, loaded


@pytest.mark.parametrize(
    "command", [["runs"], ["trace", "nope"], ["view", "nope"], ["approve", "nope"]]
)
def test_commands_that_read_runs_do_not_load_the_model_client(
    command: list[str], tmp_path: Path
) -> None:
    code, loaded = _fleet_modules(*command, "--output-dir", str(tmp_path))
    assert code in (0, 2) and loaded == []


def test_a_job_file_with_a_mistake_is_refused_before_the_model_client_loads(
    tmp_path: Path,
) -> None:
    job = tmp_path / "job.toml"
    job.write_text('name = "x"\n[[members]]\nid = "a"\nkind = "coding"\n')
    code, loaded = _fleet_modules("run", str(job), "--output-dir", str(tmp_path))
    assert (code, loaded) == (2, [])
